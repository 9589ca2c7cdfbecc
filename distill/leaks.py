"""How many leaks does the validator catch, beyond the wordings its patterns were written for? ``python -m distill
leaks``.

The narration's reject counts are circular: the ``template-noisy`` narrator injects exactly the wordings
(`distill.narrate.FAULTS`) the validator's patterns were written for. This job measures, over the predicate sets of a
split (honest body: the template narration of the set, which passes):

- **injected**: each `FAULTS` kind added the narrator's way (`distill.narrate.noisy_rationale`); caught = rejected;
- **held-out**: leaks of the same kinds worded differently (`HELDOUT`: spelled durations and fractions, indices
  counted from the end, announcements, direction words other than "moving", padding without evidence, the answer
  restated, and post-horizon states described in free words by the corpus describer,
  `eval.synth.lexicon.describe`, true of none of the object's states up to the horizon); one wording of each kind
  per set (seeded), so every wording is tried across the sets; caught = rejected; the rate of each wording is in
  ``per_wording``;
- **free-worded future leaks** with the pattern checks only and with the semantic check (`distill.semantic`);
- **honest paraphrases** (`distill.rationale_stats.honest_paraphrase_probe`): true states described in free words;
  every rejection for a contradiction or a leak is a false one; with and without the semantic check.

``catch rate = caught / n`` with a 95% CI from a bootstrap over videos. ``--sweep`` adds the threshold / margin sweep
of the semantic check on ``calibration_split`` (free-worded leaks caught against honest paraphrases falsely
rejected), the table its constants were chosen from. Writes ``<out>/leaks.json`` and ``<out>/leaks.md``.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import InputError

#: Held-out wordings per kind ({s}: the object, {a}: a phrasing of the answer, {opp}: the opposite direction).
HELDOUT: dict[str, tuple[str, ...]] = {
    "number": ("It changes within a second.", "The change comes a tenth of a second later.",
               "Give it an eighth of a second.", "It needs a frame or two more.",
               "After a handful of frames it changes.", "It takes about 0.4 s.", "In under two seconds it changes.",
               "It happens a dozen frames later.", "It covers three-fifths of the distance.",
               "It is some twenty units away from the edge.", "That is roughly thirty percent of the way.",
               "It changes a second later."),
    "frame_index": ("In the penultimate frame it is lower.", "By the second-to-last frame it has shifted.",
                    "In the third image it is lower.", "At snapshot twelve it moves.",
                    "On the frame before last it shifts.", "By the last-but-one frame it has turned."),
    "answer_statement": ("My answer: {a}.", "So the final answer would be {a}.", "The expected answer is {a}.",
                         "I was told it ends {a}.", "Answer - {a}.", "My prediction is {a}."),
    "answer_restated": ("So the {s} will be {a}.", "That means it will be {a}.", "In the end it will be {a}.",
                        "Which leaves the {s} {a} at the moment asked about."),
    "contradiction_still": ("The {s} is drifting to the right.", "It travels leftward.",
                            "The {s} is heading downward.", "The {s} is rolling to the left.",
                            "The {s} goes upward.", "The {s} is in motion."),
    "contradiction_moving": ("The {s} is heading {opp}.", "It travels {opp}.", "The {s} stands still.",
                             "The {s} is at rest.", "The {s} is coasting {opp}.", "The {s} has come to a halt."),
    "no_evidence": ("A careful look settles the matter. The object of the question deserves all the attention here, "
                    "and nothing else in view changes the picture. What happens next depends on the forces acting "
                    "on it, and those are plain to see. There is no reason to expect anything unusual, so the "
                    "ordinary course of events should hold. I keep the reasoning short and qualitative, without any "
                    "measurements. Step by step the picture becomes clear, and one state follows from the other. The "
                    "conclusion below follows from this reading of the situation, and I am confident in it.",),
    "future_free": ("Eventually the {s} will be {p}.", "After that the {s} ends up {p}.",
                    "Soon afterwards it will be {p}.", "By then the {s} will be {p}."),
}
_OPPOSITE_WORDS = {"left": "to the right", "right": "to the left", "up": "downward", "down": "upward"}


@dataclass
class LeaksConfig:
    """``python -m distill leaks``: the validator's catch rates on injected and on held-out leaks."""

    data: str = field(metadata={"help": "benchmark directory"})
    predicates: str = field(metadata={"help": "predicates JSONL (python -m distill predicates)"})
    out: str = field(metadata={"help": "output directory"})
    split: str = field(default="test", metadata={"help": "predicate sets the rates are measured on"})
    limit: int | None = field(default=None, metadata={"help": "at most N sets (stratified by video)"})
    semantic: bool = field(default=True, metadata={"help": "also measure with the semantic leak check"})
    model: str = field(default="packaged:all-MiniLM-L6-v2", metadata={
        "help": "sentence-transformers model of the semantic check (id, path, or packaged:all-MiniLM-L6-v2)"})
    sweep: bool = field(default=False, metadata={
        "help": "sweep the semantic check's threshold and margin on calibration_split"})
    calibration_split: str = field(default="train", metadata={"help": "split of the sweep"})
    calibration_limit: int = field(default=400, metadata={"help": "sets of the sweep (stratified by video)"})
    seed: int = field(default=0, metadata={"help": "wording and sampling seed"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples (over videos)"})


# --- leaks ------------------------------------------------------------------------------------------------------

def _with(body: str, extra: str, answer: str) -> str:
    return f"{body} {extra}\nAnswer: {answer}"


def free_future_phrase(ps, rng) -> str | None:
    """A free description of the object's state right after the target that is true of none of its states up to
    the horizon (None without a simulator key, or when every description drawn is also true earlier)."""
    from eval.synth.lexicon import TrueState, describe, satisfies

    if not TrueState.is_key(ps.next_true_state):
        return None
    truths = [TrueState.from_key(t) for t in ps.true_states if TrueState.is_key(t)]
    for _ in range(4):
        phrase, den = describe(TrueState.from_key(ps.next_true_state), rng)
        if not any(satisfies(t, den) for t in truths):
            return phrase
    return None


def heldout_leaks(ps, body: str, members, rng) -> list[tuple[str, str, str]]:
    """(kind, wording id, text) of the held-out leaks `HELDOUT` applies to ``ps`` (module docstring): one wording of
    each kind per set, drawn with ``rng``, so every wording is tried across the sets."""
    s = ps.subject
    ans = members.get(ps.answer, (ps.answer,))[int(rng.integers(len(members.get(ps.answer, (ps.answer,)))))]
    out = []

    def add(kind, bank, **values):
        i = int(rng.integers(len(HELDOUT[bank])))
        out.append((kind, f"{bank}:{i}", _with(body, HELDOUT[bank][i].format(**values), ps.answer)))

    add("number", "number")
    add("frame_index", "frame_index")
    add("answer_statement", "answer_statement", a=ans)
    named = {ps.current, *ps.intermediate, *([ps.anchor] if ps.anchor else []),
             *(f.value for f in ps.facts if f.kind == "other_end_state" and f.value)}
    if ps.answer not in named:
        add("answer_restated", "answer_restated", s=s, a=ans)
    d = ps.fact("direction")
    if d is not None and d.value == "still":
        add("contradiction", "contradiction_still", s=s)
    elif d is not None and d.value:
        add("contradiction", "contradiction_moving", s=s, opp=_OPPOSITE_WORDS[d.value.split("-")[-1]])
    out.append(("no_evidence", "no_evidence:0", f"{HELDOUT['no_evidence'][0]}\nAnswer: {ps.answer}"))
    phrase = free_future_phrase(ps, rng)
    if phrase:
        add("future_free", "future_free", s=s, p=phrase)
    return out


def injected_leaks(ps, members, rng, validator) -> list[tuple[str, str]]:
    """(kind, text) of each `distill.narrate.FAULTS` kind ``ps`` can carry, injected the narrator's way."""
    from distill.narrate import FAULTS, noisy_rationale

    out = []
    for fault in FAULTS:
        if fault == "future_leak" and not ps.after_horizon_states:
            continue
        if fault == "contradiction" and ps.fact("direction") is None:
            continue
        out.append((fault, noisy_rationale(ps, fault, rng, members, min_words=validator.min_words,
                                           max_words=validator.max_words)))
    return out


# --- rates ------------------------------------------------------------------------------------------------------

def rate(rows: list[tuple[str, bool]], resamples: int, seed: int) -> dict[str, Any]:
    """``{n, caught, value, ci_low, ci_high}`` of (video, caught) rows, CI by video."""
    from distill.faithfulness import cluster_bootstrap

    if not rows:
        return {"n": 0, "caught": 0, "value": None, "ci_low": None, "ci_high": None}
    v = [r[0] for r in rows]
    x = np.asarray([float(r[1]) for r in rows])
    return {"n": len(rows), "caught": int(x.sum()),
            **cluster_bootstrap(x, np.ones(len(x)), v, n_resamples=resamples, seed=seed)}


def _sets(cfg: LeaksConfig, split: str, limit: int | None, bench):
    from distill.faithfulness import sample_by_video
    from distill.narrate import read_predicates

    ids = set(bench.query_field("id", split))
    video = bench.query_field("video_id")
    sets = [ps for ps in read_predicates(cfg.predicates) if ps.query_id in ids]
    for ps in sets:
        ps.video_id = ps.video_id or video.get(ps.query_id, "")
    return sample_by_video(sets, lambda ps: ps.video_id, limit, cfg.seed)


def measure(sets, validator, semantic_validator, cfg: LeaksConfig) -> dict[str, Any]:
    """Injected and held-out catch rates (pattern checks; the free-worded future leaks and the honest paraphrases
    also with the semantic check)."""
    from distill.narrate import template_rationale
    from distill.rationale_stats import honest_paraphrase_probe
    from distill.validator import split_answer

    injected, heldout, per_wording = defaultdict(list), defaultdict(list), defaultdict(list)
    free_sem: list[tuple[str, bool]] = []
    for ps in sets:
        rng = random.Random(zlib.crc32(ps.query_id.encode()) + cfg.seed)
        body = split_answer(template_rationale(ps, min_words=validator.min_words, max_words=validator.max_words))[0]
        for kind, text in injected_leaks(ps, validator.members, rng, validator):
            injected[kind].append((ps.video_id, not validator.check(text, ps).ok))
        nprng = np.random.default_rng(zlib.crc32(ps.query_id.encode()) + cfg.seed)
        for kind, wid, text in heldout_leaks(ps, body, validator.members, nprng):
            caught = not validator.check(text, ps).ok
            heldout[kind].append((ps.video_id, caught))
            per_wording[wid].append(caught)
            if kind == "future_free" and semantic_validator is not None:
                free_sem.append((ps.video_id, not semantic_validator.check(text, ps).ok))
    rows = [{"query_id": ps.query_id, "answer": ps.answer, "rationale": template_rationale(ps)} for ps in sets]
    sets_by_id = {ps.query_id: ps for ps in sets}
    honest = honest_paraphrase_probe(rows, sets_by_id, validator, cfg.seed)
    r, s = cfg.resamples, cfg.seed
    out = {"sets": len(sets), "videos": len({ps.video_id for ps in sets}),
           "injected": {k: rate(v, r, s) for k, v in sorted(injected.items())},
           "heldout": {k: rate(v, r, s) for k, v in sorted(heldout.items())},
           "injected_all": rate([x for v in injected.values() for x in v], r, s),
           "heldout_all": rate([x for v in heldout.values() for x in v], r, s),
           "per_wording": {k: round(float(np.mean(v)), 4) for k, v in sorted(per_wording.items())},
           "honest": honest}
    if semantic_validator is not None:
        out["future_free_semantic"] = rate(free_sem, r, s)
        out["honest_semantic"] = honest_paraphrase_probe(rows, sets_by_id, semantic_validator, cfg.seed)
    return out


def sweep(sets, validator, semantic, cfg: LeaksConfig) -> list[dict[str, Any]]:
    """Free-worded leaks caught and honest paraphrases falsely rejected by the semantic check alone, for a grid of
    (threshold, margin), on ``sets`` (module docstring)."""
    from distill.narrate import template_rationale
    from distill.rationale_stats import _LATER, _NOW
    from distill.validator import split_answer
    from eval.synth.lexicon import TrueState, describe

    leak_scores, honest_scores = [], []
    for ps in sets:
        nprng = np.random.default_rng(zlib.crc32(ps.query_id.encode()) + cfg.seed)
        body = split_answer(template_rationale(ps))[0]
        phrase = free_future_phrase(ps, nprng)
        if phrase:
            text = f"{body} " + HELDOUT["future_free"][0].format(s=ps.subject, p=phrase)
            leak_scores.append(_max_scores(text, ps, validator, semantic))
        extra = []
        for i, key in enumerate(ps.true_states[:-1]):
            if key and TrueState.is_key(key):
                p, _ = describe(TrueState.from_key(key), nprng)
                forms = _NOW if i == 0 else _LATER
                extra.append(forms[int(nprng.integers(len(forms)))].format(subject=ps.subject, state=p))
        if extra:
            honest_scores.append(_max_scores(f"{body} {' '.join(extra)}", ps, validator, semantic))
    grid = []
    for t in (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7):
        for m in (-0.05, -0.02, 0.0, 0.02, 0.05, 0.1):
            def hit(sc, t=t, m=m):
                return any(f >= t and f - a >= m for f, a in sc)
            grid.append({"threshold": t, "margin": m, "leaks": len(leak_scores), "honest": len(honest_scores),
                         "caught": round(float(np.mean([hit(sc) for sc in leak_scores])), 4) if leak_scores else None,
                         "false_rejections": round(float(np.mean([hit(sc) for sc in honest_scores])), 4)
                         if honest_scores else None})
    return grid


def _max_scores(text: str, ps, validator, semantic) -> list[tuple[float, float]]:
    from distill.semantic import state_texts, strip_subject

    cands = validator.future_sentences(text, ps)
    if not cands or not ps.after_horizon_states:
        return []
    forbidden, allowed = state_texts(ps, validator.phrasings)
    sc = semantic.scores([strip_subject(c, ps.subject) for c in cands], forbidden, allowed)
    return [(float(f), float(a)) for f, a in sc]


def run_leaks(cfg: LeaksConfig) -> dict[str, Any]:
    """Measure and write the rates (module docstring); returns ``leaks.json``."""
    from distill.validator import RationaleValidator, validator_for
    from eval.benchmark import Benchmark
    from eval.io import write_json

    t0 = time.perf_counter()
    bench = Benchmark.load(cfg.data)
    validator = validator_for(bench)
    semantic = sem_validator = None
    if cfg.semantic:
        from distill.semantic import SemanticLeaks

        semantic = SemanticLeaks(model_name=cfg.model)
        sem_validator = RationaleValidator(validator.members, semantic=semantic)
        sem_validator.denotations = validator.denotations
    sets = _sets(cfg, cfg.split, cfg.limit, bench)
    if not sets:
        raise InputError(f"{cfg.predicates}: no predicate sets for split {cfg.split!r}")
    result = {"split": cfg.split, **measure(sets, validator, sem_validator, cfg)}
    if semantic is not None:
        result["semantic"] = {"model": cfg.model, "threshold": semantic.threshold, "margin": semantic.margin}
    if cfg.sweep and semantic is not None:
        cal = _sets(cfg, cfg.calibration_split, cfg.calibration_limit, bench)
        result["sweep"] = {"split": cfg.calibration_split, "sets": len(cal),
                           "grid": sweep(cal, validator, semantic, cfg)}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(cfg.out)
    write_json(out / "leaks.json", result)
    (out / "leaks.md").write_text(to_markdown(result), encoding="utf-8")
    return result


def _pct(r: dict | None) -> str:
    if not r or r.get("value") is None:
        return "–"
    return f"{100 * r['value']:.1f} [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}] (n {r['n']})"


def to_markdown(result: dict[str, Any]) -> str:
    """Catch rates by kind (injected vs held-out), free-worded leaks and honest paraphrases with and without the
    semantic check, and the sweep."""
    kinds = sorted(set(result["injected"]) | set(result["heldout"]))
    lines = [f"Validator catch rates on {result['sets']} {result['split']} predicate sets ({result['videos']} videos; "
             "% with 95% CI by video)", "", "| kind | injected (narrator's wordings) | held-out (other wordings) |",
             "|---|---|---|"]
    lines += [f"| {k} | {_pct(result['injected'].get(k))} | {_pct(result['heldout'].get(k))} |" for k in kinds]
    lines.append(f"| all | {_pct(result['injected_all'])} | {_pct(result['heldout_all'])} |")
    h = result["honest"]
    lines += ["", f"Free-worded post-horizon states (held-out `future_free`): patterns {_pct(result['heldout'].get('future_free'))}"
              + (f"; with the semantic check {_pct(result.get('future_free_semantic'))}" if "future_free_semantic"
                 in result else "") + ".",
              f"Honest paraphrases falsely rejected: patterns {h['rejected']} of {h['n']} "
              f"({100 * (h['rejected_share'] or 0):.1f}%)"]
    hs = result.get("honest_semantic")
    if hs:
        lines[-1] += f"; with the semantic check {hs['rejected']} of {hs['n']} ({100 * (hs['rejected_share'] or 0):.1f}%)"
        s = result["semantic"]
        lines[-1] += f" (threshold {s['threshold']}, margin {s['margin']}, {s['model']})."
    c = h.get("leak_control") or {}
    if c.get("n"):
        cs = (hs or {}).get("leak_control") or {}
        lines.append(f"Leak control of `rationale-stats` (\"Later the <object> will be <free description>\"): "
                     f"{c['caught']} of {c['n']} caught by the patterns ({100 * (c['caught_share'] or 0):.1f}%)"
                     + (f"; {cs['caught']} of {cs['n']} with the semantic check "
                        f"({100 * (cs['caught_share'] or 0):.1f}%)" if cs.get("n") else "") + ".")
    sw = result.get("sweep")
    if sw:
        lines += ["", f"Semantic check alone on {sw['sets']} {sw['split']} sets (calibration):", "",
                  "| threshold | margin | free-worded leaks caught % | honest paraphrases rejected % |",
                  "|---|---|---|---|"]
        lines += [f"| {g['threshold']} | {g['margin']} | {100 * (g['caught'] or 0):.1f} | "
                  f"{100 * (g['false_rejections'] or 0):.1f} |" for g in sw["grid"]]
    return "\n".join(lines) + "\n"
