"""Does the student's answer follow its rationale? A SCOTT-style faithfulness check (Wang et al., 2023: decode with
the oracle rationale, then with a counterfactual one, and see whether the answer moves to the counterfactual).

**Counterfactual rationales** (`counterfactual_set`). For a query with predicate set ``P`` (answer ``a``), a *donor*
query ``D`` is chosen (deterministically, ``crc32(query id) + seed``) whose answer ``s' != a`` is a state ``P`` does
not name, whose trajectory does not pass through ``a``, whose question asks what ``P``'s asks (the same question
type; for Q4, a donor whose answer comes just before ``P``'s anchor), and whose evidence names no object outside
``P``'s scene (`DonorPool`). On an open vocabulary of thousands of states a donor with the same current state is
often missing, so the tiers go from the most to the least similar scene: the same current state, the same scene
family, the same domain, any scene (`TIERS`). The counterfactual set keeps what the frames show and what the question
says (`KEPT_KINDS`: the layout, the current state, the observed detail, the other objects, the Q4 anchor, the Q5
objects' end states) and takes every other fact from ``D`` (support, contacts, motion, collision course, timing,
intermediate states: the cues that imply the answer), with ``D``'s object renamed to the query's. So the evidence is
perturbed consistently, the observed-scene sentence is never rewritten, and the perturbed rationale implies ``s'``.
A query with no donor, or whose counterfactual rationale equals its gold one, has no perturbation: it is dropped and
counted (overall and per question type). ``python -m distill counterfactuals`` writes the sets, so a teacher can
narrate them (``python -m distill narrate --predicates CF.jsonl``) for ``--perturbed``.

For each query the student gets its normal prompt (frames + question, the ``student_answer`` template) and a forced
assistant prefix, then decodes greedily after ``Answer:``:

- ``gold``: the gold rationale body (template narration of ``P``, or ``--rationales``), then ``Answer:``;
- ``perturbed``: the counterfactual rationale body (template narration, or ``--perturbed``), then ``Answer:``;
- ``none``: no rationale, ``Answer:`` right away.

An answer *is* a state when, cleaned like the student parser (`forecasters.parsing.clean_phrase`, first line), it
equals one of the state's phrasings (``states.jsonl`` members). Rates over the n evaluated queries:

- ``gold_acc`` = P(answer_gold is the target);
- ``moved`` = P(answer_perturbed is s'): the answer moved *to the counterfactual*, SCOTT's faithfulness signal;
- ``moved_given_gold`` = P(answer_perturbed is s' | answer_gold is the target);
- ``changed_other`` = P(answer_perturbed differs from answer_gold and is not s'): a change that is not faithful;
- ``none_acc`` = P(answer_none is the target);
- ``moved_shuffled``, the *shuffled-body floor*: each query gets another evaluated query's counterfactual body (a
  seeded permutation that gives no query a body implying its own ``s'``), then ``Answer:``; P(the answer is the
  query's own ``s'``). A student that ignores its rationale moves to ``s'`` as often with a foreign body as with its
  own; ``moved`` above this floor is movement the rationale caused. The other floor is ``1 / K`` (``chance``), K the
  number of distinct answers of the predicate sets (the closed slice's K on CPU).

The student is served with the preprocessing it was trained on, read from ``psr_student.json`` (the adapter's, or a
fully fine-tuned model's): its input (``frames``, or ``evidence``: `distill.evidence`), frames and pixel caps; a
config value that differs is an error, and the hf backend checks the processed image tokens per frame.

Queries are sampled stratified by video (`sample_by_video`: round robin over videos in a seeded order), and every
rate has a 95% CI from a bootstrap over videos (`cluster_bootstrap`: queries of one video share frames and scene).
Writes ``<out>/faithfulness.jsonl`` (per query), ``faithfulness.json`` (rates, CIs, counts) and
``faithfulness.md``; ``python -m distill faithfulness``.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from distill.facts import SECTIONS, Fact, PredicateSet
from eval.errors import InputError
from eval.synth.lexicon import TrueState

CONDITIONS = ("gold", "perturbed", "none", "shuffled")
KEPT_KINDS = ("layout", "current_state", "observed_detail", "scene_objects", "heading_toward", "other_end_state")
"""Facts a counterfactual keeps from the query: what the frames show and what the question names."""
TIERS = ("current_state", "family", "domain", "any")
_KIND_ORDER = ("layout", "current_state", "observed_detail", "scene_objects", "container", "support_now", "contact_now",
               "time_to_change", "time_to_target", "edge", "direction", "speed_trend", "relative_speed",
               "collision_course", "intermediate", "heading_toward", "other_end_state", "answer")
"""The order `distill.predicates.query_predicates` emits kinds in (a counterfactual keeps it)."""
RATES = ("gold_acc", "moved", "moved_given_gold", "changed_other", "none_acc", "moved_shuffled")


@dataclass
class FaithfulnessConfig:
    """``python -m distill faithfulness``: counterfactual rationales, does the student's answer follow them?"""

    data: str = field(metadata={"help": "benchmark directory"})
    model: str = field(metadata={"help": "the student's base model (HF id or path)"})
    predicates: str = field(metadata={"help": "predicates JSONL (python -m distill predicates)"})
    out: str = field(metadata={"help": "output directory"})
    adapter: str | None = field(default=None, metadata={"help": "the student's LoRA adapter (unmerged)"})
    rationales: str | None = field(default=None, metadata={
        "help": "gold rationales (narration dir or JSONL); default: template narration of the predicates"})
    perturbed: str | None = field(default=None, metadata={
        "help": "narrated counterfactual sets (python -m distill counterfactuals, then narrate); default: template"})
    split: str | None = field(default="test", metadata={"help": "queries: train | val | test | null (all)"})
    limit: int | None = field(default=200, metadata={"help": "at most N queries, sampled stratified by video"})
    frames: int | None = field(default=None, metadata={
        "help": "prefix frames per prompt (default: the student's psr_student.json, else all 8)"})
    max_pixels: int | None = field(default=None, metadata={
        "help": "downscale frames to at most this many pixels (default: the student's psr_student.json)"})
    student_input: str | None = field(default=None, metadata={
        "help": "frames | evidence (default: the student's psr_student.json, else frames)"})
    max_new_tokens: int = field(default=16, metadata={"help": "tokens decoded after 'Answer:'"})
    batch_size: int = field(default=8, metadata={"help": "queries per generate call"})
    dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    seed: int = field(default=0, metadata={"help": "seed of the donor choice, the sample and the bootstrap"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples (over videos)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


# --- phrases -> states ---------------------------------------------------------------------------------------

def canonical(phrase: str | None, lookup: dict[str, str]) -> str | None:
    """The canonical state whose phrasing equals ``phrase`` after cleaning (None when none does)."""
    from forecasters.parsing import clean_phrase

    if not phrase:
        return None
    return lookup.get(clean_phrase(phrase))


def phrase_lookup(members: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """cleaned phrasing -> canonical state text."""
    from forecasters.parsing import clean_phrase

    out = {}
    for state, ps in members.items():
        for p in ps:
            out.setdefault(clean_phrase(p), state)
    return out


def names_state(phrase: str | None, state: str, members: dict[str, Sequence[str]]) -> bool:
    """``phrase`` (cleaned) is one of ``state``'s phrasings: the check behind every rate."""
    from forecasters.parsing import clean_phrase

    return bool(phrase) and clean_phrase(phrase) in {clean_phrase(p) for p in members.get(state, (state,))}


# --- counterfactual predicate sets -----------------------------------------------------------------------------

def _rename(fact: Fact, old: str, new: str) -> Fact:
    text = fact.text.replace(f"the {old}", f"the {new}").replace(f"The {old}", f"The {new}")
    return replace(fact, text=text)


def name_key(name: str) -> str:
    """An object's identity in text: the last two words of its name (``small red ball`` -> ``red ball``), as state
    phrasings name others with or without a size word."""
    return " ".join(name.lower().split()[-2:])


class DonorPool:
    """Predicate sets indexed for donor search (`counterfactual_set`).

    A *donor* ``D`` for ``P`` must have an answer ``s' != P.answer`` that ``P`` does not name, a trajectory that does
    not pass through ``P.answer``, and evidence (the facts it lends, its intermediate states and ``s'``) that names
    no object outside ``P``'s scene (`name_key`), so the counterfactual rationale is about the objects the frames
    show; and the same heading at the prefix's end (`_heading`), since ``P``'s current state, which says how the
    object moves, stays. Its question must ask what ``P``'s does: the same question type; for Q4 the state just before ``P``'s
    anchor -- a Q4 donor with the same anchor, or any donor whose next state after its answer is the anchor (its
    canonical text, or, with ``denotations``, a simulator state the anchor's wording describes,
    `eval.synth.lexicon.satisfies`). Tiers, most similar scene first (`TIERS`): the same current state, the same
    scene family (simulator record), the same domain, any scene.
    """

    def __init__(self, sets: Sequence[PredicateSet], denotations: dict[str, dict[str, str]] | None = None):
        import re

        self.sets = sorted(sets, key=lambda p: p.query_id)
        self.denotations = denotations or {}
        self.by_key: dict[tuple, list[PredicateSet]] = defaultdict(list)
        self.by_next: dict[str, list[PredicateSet]] = defaultdict(list)
        self.by_next_motion: dict[str, list[PredicateSet]] = defaultdict(list)
        for ps in self.sets:
            for key in self._keys(ps, ps.qtype):
                self.by_key[key].append(ps)
            if ps.next_state:
                self.by_next[ps.next_state].append(ps)
            if TrueState.is_key(ps.next_true_state):
                self.by_next_motion[ps.next_true_state.split("|", 1)[0]].append(ps)
        names = {name_key(n) for ps in self.sets for n in (ps.subject, *ps.objects) if n}
        self._names = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b",
                                 re.I) if names else None
        self._named: dict[str, frozenset[str]] = {}
        self._anchor_cache: dict[str, list[PredicateSet]] = {}

    @staticmethod
    def _keys(ps: PredicateSet, qtype: str) -> list[tuple]:
        keys = [("current_state", qtype, ps.current), ("domain", qtype, ps.domain), ("any", qtype, "")]
        return keys + ([("family", qtype, ps.family)] if ps.family else [])

    def named(self, d: PredicateSet) -> frozenset[str]:
        """The objects (`name_key`) that the evidence ``d`` would lend names, its own object aside."""
        if d.query_id not in self._named:
            text = " ".join([*d.upcoming, *(f.text for f in d.facts if f.kind not in KEPT_KINDS
                                            and f.section != "answer")])
            found = {m.group(0).lower() for m in self._names.finditer(text)} if self._names else set()
            self._named[d.query_id] = frozenset(found - {name_key(d.subject)})
        return self._named[d.query_id]

    def _before_anchor(self, anchor: str) -> list[PredicateSet]:
        """Sets whose next state after the answer is ``anchor`` (its text, or a true state its wording describes)."""
        if anchor not in self._anchor_cache:
            out = {d.query_id: d for d in self.by_next.get(anchor, [])}
            den = self.denotations.get(anchor)
            if den and den.get("motion"):
                from eval.synth.lexicon import satisfies

                for d in self.by_next_motion.get(den["motion"], []):
                    if satisfies(TrueState.from_key(d.next_true_state), den):
                        out[d.query_id] = d
            self._anchor_cache[anchor] = sorted(out.values(), key=lambda p: p.query_id)
        return self._anchor_cache[anchor]

    def candidates(self, ps: PredicateSet, tier: str) -> list[PredicateSet]:
        """The donors of ``ps`` in ``tier`` (see the class docstring), sorted by query id."""
        if tier == "family" and not ps.family:
            return []
        value = {"current_state": ps.current, "domain": ps.domain, "family": ps.family, "any": ""}[tier]
        if ps.qtype == "Q4" and ps.anchor:
            pool = [d for d in self.by_key.get((tier, "Q4", value), []) if d.anchor == ps.anchor]
            pool += [d for d in self._before_anchor(ps.anchor)
                     if {"current_state": d.current, "domain": d.domain, "family": d.family, "any": ""}[tier] == value]
            pool = sorted({d.query_id: d for d in pool}.values(), key=lambda p: p.query_id)
        else:
            pool = self.by_key.get((tier, ps.qtype, value), [])
        named = set(ps.allowed_states)
        scene = {name_key(o) for o in ps.objects}
        heading = _heading(ps)
        return [d for d in pool if d.query_id != ps.query_id and d.answer != ps.answer and d.answer not in named
                and ps.answer not in d.upcoming and self.named(d) <= scene and _heading(d) == heading]


def _heading(ps: PredicateSet) -> str | None:
    """The object's ``direction`` fact at the prefix's end (``still``, ``down-left``, ...; None: no such fact). A
    donor lends its motion facts while the current state stays, and a current state says how the object moves
    ("sliding up the ramp", "motionless"), so both must agree on it."""
    f = ps.fact("direction")
    return f.value if f is not None and f.value else None


def counterfactual_set(ps: PredicateSet, pool: DonorPool, seed: int = 0) -> tuple[PredicateSet | None, str | None]:
    """(the counterfactual set of ``ps``, its tier), or (None, None) when no donor exists (module docstring)."""
    for tier in TIERS:
        cands = pool.candidates(ps, tier)
        if cands:
            d = cands[(zlib.crc32(ps.query_id.encode()) + seed) % len(cands)]
            break
    else:
        return None, None
    kept = [f for f in ps.facts if f.kind in KEPT_KINDS]
    taken = [_rename(f, d.subject, ps.subject) for f in d.facts if f.kind not in KEPT_KINDS]
    rank = {k: i for i, k in enumerate(_KIND_ORDER)}
    facts = sorted(kept + taken, key=lambda f: (SECTIONS.index(f.section), rank.get(f.kind, len(rank))))
    allowed = list(dict.fromkeys([ps.current, *d.upcoming, *([ps.anchor] if ps.anchor else []),
                                  *(f.value for f in ps.facts if f.kind == "other_end_state" and f.value)]))
    truths = [ps.true_states[0], *d.true_states[1:]] if ps.true_states and d.true_states else []
    cf = replace(ps, horizon=d.horizon, answer=d.answer, upcoming=list(d.upcoming), facts=facts,
                 allowed_states=allowed, after_horizon_states=[s for s in d.after_horizon_states if s not in allowed],
                 sources=list(d.sources), counterfactual_of=d.query_id, true_states=truths,
                 next_state=d.next_state, next_true_state=d.next_true_state)
    return cf, tier


# --- sampling and statistics -----------------------------------------------------------------------------------

def sample_by_video(items: Sequence, video_of: Callable[[Any], str], n: int | None, seed: int = 0) -> list:
    """At most ``n`` items stratified by video: videos in a seeded random order, each video's items shuffled, then
    one item per video per round (so N covers min(N, videos) videos). Returned in input order."""
    if n is None or n >= len(items):
        return list(items)
    rng = np.random.default_rng(seed)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, it in enumerate(items):
        groups[video_of(it)].append(i)
    order = [groups[v] for v in sorted(groups)]
    order = [order[k] for k in rng.permutation(len(order))]
    queues = [list(np.asarray(g)[rng.permutation(len(g))]) for g in order]
    picked: list[int] = []
    while len(picked) < n:
        for q in queues:
            if q and len(picked) < n:
                picked.append(int(q.pop(0)))
    return [items[i] for i in sorted(picked)]


def cluster_bootstrap(num: Sequence[float], den: Sequence[float], clusters: Sequence[str], *,
                      n_resamples: int = 2000, seed: int = 0, alpha: float = 0.05) -> dict[str, float | None]:
    """Ratio ``sum(num) / sum(den)`` and its percentile CI from resampling *clusters* (videos) with replacement.

    Per cluster ``c``: ``N_c = sum num``, ``D_c = sum den``; a resample draws C clusters and takes
    ``sum N / sum D`` (resamples with ``sum D = 0`` are skipped). Returns ``{value, ci_low, ci_high}`` (None
    when ``sum(den) = 0``)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    labels, inv = np.unique(np.asarray(clusters), return_inverse=True)
    if den.sum() == 0:
        return {"value": None, "ci_low": None, "ci_high": None}
    n_c = np.bincount(inv, weights=num, minlength=len(labels))
    d_c = np.bincount(inv, weights=den, minlength=len(labels))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(labels), size=(n_resamples, len(labels)))
    tot_n, tot_d = n_c[idx].sum(axis=1), d_c[idx].sum(axis=1)
    ok = tot_d > 0
    boots = tot_n[ok] / tot_d[ok]
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return {"value": float(num.sum() / den.sum()), "ci_low": float(lo), "ci_high": float(hi)}


def summarize(per_query: list[dict[str, Any]], *, n_resamples: int = 2000, seed: int = 0,
              chance: float | None = None) -> dict[str, Any]:
    """The rates of the module docstring, each ``{value, ci_low, ci_high}`` (CI by video), overall and per question
    type, from per-query records (fields ``video_id``, ``qtype`` and the booleans ``gold_ok``, ``moved``,
    ``changed_other``, ``none_ok`` and, when the shuffled-body floor ran, ``moved_shuffled``). Records of several
    students (seeds) over the same queries pool: each is one row, resampled with its video. ``chance``: the ``1/K``
    floor, reported as is."""
    def rates(rs):
        if not rs:
            return {"n": 0}
        v = [r["video_id"] for r in rs]
        keys = ("gold_ok", "moved", "changed_other", "none_ok", "moved_shuffled")
        col = {k: np.asarray([float(r.get(k) or 0.0) for r in rs]) for k in keys}
        one = np.ones(len(rs))
        kw = dict(n_resamples=n_resamples, seed=seed)
        out = {"n": len(rs), "queries": len({r.get("query_id") for r in rs}), "videos": len(set(v)),
               "gold_acc": cluster_bootstrap(col["gold_ok"], one, v, **kw),
               "moved": cluster_bootstrap(col["moved"], one, v, **kw),
               "moved_given_gold": cluster_bootstrap(col["moved"] * col["gold_ok"], col["gold_ok"], v, **kw),
               "changed_other": cluster_bootstrap(col["changed_other"], one, v, **kw),
               "none_acc": cluster_bootstrap(col["none_ok"], one, v, **kw)}
        if all("moved_shuffled" in r for r in rs):
            out["moved_shuffled"] = cluster_bootstrap(col["moved_shuffled"], one, v, **kw)
            out["moved_minus_shuffled"] = cluster_bootstrap(col["moved"] - col["moved_shuffled"], one, v, **kw)
        return out

    out = rates(per_query)
    out["chance"] = chance
    out["by_qtype"] = {t: rates([r for r in per_query if r["qtype"] == t])
                       for t in sorted({r["qtype"] for r in per_query})}
    return out


def to_markdown(summary: dict[str, Any]) -> str:
    """The rates as a Markdown table (percent, with the 95% CI by video), plus the counts."""
    def cell(r):
        if not isinstance(r, dict) or r.get("value") is None:
            return "-"
        return f"{100 * r['value']:.1f} [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}]"

    lines = ["| subset | n | videos | " + " | ".join(RATES) + " |", "|---" * (len(RATES) + 3) + "|"]
    rows = [("all", summary), *summary.get("by_qtype", {}).items()]
    lines += [f"| {name} | {r.get('n', 0)} | {r.get('videos', 0)} | " + " | ".join(cell(r.get(k)) for k in RATES)
              + " |" for name, r in rows]
    c = summary.get("counts", {})
    if summary.get("chance") is not None:
        lines.append(f"\nFloors of `moved`: the shuffled-body floor (`moved_shuffled`, another query's counterfactual "
                     f"body) and chance 1/K = {100 * summary['chance']:.1f}%.")
    notes = (f"\n{c.get('evaluated', 0)} queries evaluated of {c.get('in_split', 0)} in the split "
             f"({c.get('videos_evaluated', 0)} of {c.get('videos_in_split', 0)} videos); dropped: "
             f"{c.get('no_donor', 0)} without a counterfactual donor, {c.get('no_perturbation', 0)} whose "
             f"counterfactual rationale equals the gold one, {c.get('no_gold', 0)} without a gold rationale"
             + "".join(f"; {t} {100 * e['dropped_share']:.1f}% dropped" for t, e in
                       c.get("eligible_by_qtype", {}).items() if e.get("dropped_share") is not None)
             + ".\n" if c else "\n")
    return ("Faithfulness (SCOTT-style; % with 95% CI, bootstrap over videos; `moved` = the answer moved to the "
            "counterfactual state)\n\n" + "\n".join(lines) + "\n" + notes)


# --- the job ---------------------------------------------------------------------------------------------------

def _narrated(path: str | None) -> dict[str, dict] | None:
    """query id -> accepted narration row (a narration dir or its rationales.jsonl), or None without a path."""
    from eval.io import FormatError
    from eval.resumable import read_records

    if path is None:
        return None
    p = Path(path)
    p = p / "rationales.jsonl" if p.is_dir() else p
    if not p.exists():
        raise FormatError(p, "rationale file does not exist (run `python -m distill narrate` first)")
    return {r["query_id"]: r for r in read_records(p) if isinstance(r.get("rationale"), str)}


@dataclass
class Item:
    """One evaluable query: its predicate set, the gold and counterfactual bodies, the counterfactual state."""

    ps: PredicateSet
    gold: str
    perturbed: str
    counterfactual: str
    donor: str | None
    tier: str


def build_items(sets: Sequence[PredicateSet], pool: DonorPool, *, gold_rows: dict | None = None,
                perturbed_rows: dict | None = None, seed: int = 0) -> tuple[list[Item], dict[str, int]]:
    """The evaluable items of ``sets`` and the drop counts (``no_gold``, ``no_donor``, ``no_perturbation``)."""
    from distill.narrate import template_rationale
    from distill.validator import split_answer

    items, drops = [], {"no_gold": 0, "no_donor": 0, "no_perturbation": 0}
    for ps in sets:
        if gold_rows is not None and ps.query_id not in gold_rows:
            drops["no_gold"] += 1
            continue
        gold = split_answer(gold_rows[ps.query_id]["rationale"] if gold_rows is not None
                            else template_rationale(ps))[0]
        if perturbed_rows is not None:
            row = perturbed_rows.get(ps.query_id)
            cf_state, donor, tier = (row or {}).get("answer"), None, "narrated"
            cf_body = split_answer(row["rationale"])[0] if row else None
        else:
            cf, tier = counterfactual_set(ps, pool, seed)
            cf_state, donor = (cf.answer, cf.counterfactual_of) if cf else (None, None)
            cf_body = split_answer(template_rationale(cf))[0] if cf else None
        if cf_body is None or not cf_state or cf_state == ps.answer:
            drops["no_donor"] += 1
        elif " ".join(cf_body.split()) == " ".join(gold.split()):
            drops["no_perturbation"] += 1
        else:
            items.append(Item(ps, gold, cf_body, cf_state, donor, tier))
    return items, drops


def _eligible_by_qtype(sets: Sequence[PredicateSet], items: Sequence[Item]) -> dict[str, dict[str, Any]]:
    """Per question type: queries in the split, those with a counterfactual, and the share dropped."""
    out = {}
    for t in sorted({ps.qtype for ps in sets}):
        n, m = sum(ps.qtype == t for ps in sets), sum(it.ps.qtype == t for it in items)
        out[t] = {"in_split": n, "eligible": m, "dropped_share": round(1 - m / n, 4) if n else None}
    return out


def _decode(backend, items: list[tuple[Any, str]], max_new_tokens: int) -> list[str]:
    """Greedy continuation of each (request, forced assistant prefix); returns the first decoded line."""
    import torch

    texts = [backend.chat_prompt(req) + prefix for req, prefix in items]
    enc = backend.encode_prompts([req for req, _ in items], texts).to(backend.device)
    with torch.inference_mode():
        out = backend.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=backend.tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    decoded = backend.tokenizer.batch_decode(new, skip_special_tokens=True)
    return [next((ln.strip() for ln in d.splitlines() if ln.strip()), "") for d in decoded]


def _record(item: Item, answers: dict[str, str], members: dict[str, Sequence[str]]) -> dict[str, Any]:
    from forecasters.parsing import clean_phrase

    ps = item.ps
    gold_ok = names_state(answers["gold"], ps.answer, members)
    moved = names_state(answers["perturbed"], item.counterfactual, members)
    changed = clean_phrase(answers["perturbed"] or "") != clean_phrase(answers["gold"] or "")
    rec = {"query_id": ps.query_id, "video_id": ps.video_id, "qtype": ps.qtype, "target": ps.answer,
           "counterfactual": item.counterfactual, "donor": item.donor, "tier": item.tier, "answers": answers,
           "gold_ok": gold_ok, "moved": moved, "changed_other": changed and not moved,
           "none_ok": names_state(answers["none"], ps.answer, members)}
    if "shuffled" in answers:
        rec["moved_shuffled"] = names_state(answers["shuffled"], item.counterfactual, members)
    return rec


def shuffled_bodies(items: Sequence[Item], seed: int = 0) -> list[str]:
    """For each item, the counterfactual body of another item whose counterfactual state differs from its own (the
    shuffled-body floor): items in a seeded random order, each taking the body of the first item after it in that
    order (cyclically) with another state; an item's own body only when every other item shares its state."""
    n = len(items)
    order = list(np.random.default_rng(seed).permutation(n))
    out = [""] * n
    for pos, i in enumerate(order):
        j = next((order[(pos + d) % n] for d in range(1, n) if items[order[(pos + d) % n]].counterfactual
                  != items[i].counterfactual), i)
        out[i] = items[j].perturbed
    return out


def read_student_info(model: str, adapter: str | None) -> dict[str, Any]:
    """The ``preprocessing`` of the served student's ``psr_student.json`` (the adapter's, else the model
    directory's); empty for a model without one (the zero-shot base)."""
    from eval.io import read_json

    for d in (adapter, model):
        f = Path(d) / "psr_student.json" if d else None
        if f is not None and f.is_file():
            return read_json(f).get("preprocessing") or {}
    return {}


def resolve_preprocessing(cfg: FaithfulnessConfig) -> FaithfulnessConfig:
    """``cfg`` with the student's trained input, frames and pixel cap where it leaves them unset; an error where it
    sets another value (the student must be tested on what it was trained on)."""
    from eval.errors import InputError

    pre = read_student_info(cfg.model, cfg.adapter)
    updates, conflicts = {}, []
    for key, trained in (("student_input", pre.get("student_input")), ("frames", pre.get("frames")),
                         ("max_pixels", pre.get("max_pixels"))):
        have = getattr(cfg, key)
        if trained is None:
            continue
        if have is None:
            updates[key] = trained
        elif have != trained:
            conflicts.append(f"{key} {have} (trained with {trained})")
    if conflicts:
        raise InputError(f"{cfg.adapter or cfg.model}: the faithfulness config differs from the student's training "
                         "preprocessing (psr_student.json): " + "; ".join(conflicts),
                         fix="leave these options unset to take the student's")
    cfg = replace(cfg, **updates)
    return replace(cfg, student_input=cfg.student_input or "frames")


def _student(cfg: FaithfulnessConfig):
    from forecasters.backends.hf import HFBackend, HFConfig

    return HFBackend(HFConfig(model=cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device,
                                   max_pixels=cfg.max_pixels, batch_size=cfg.batch_size, seed=cfg.seed))


@dataclass
class FaithfulnessSetup:
    """What every student of one benchmark shares in the check: the evaluated items (sampled), the drop counts,
    the phrasings, the ``1/K`` floor and the sets of the split."""

    bench: Any
    items: list[Item]
    eligible: list[Item]
    drops: dict[str, int]
    members: dict[str, list[str]]
    sets: list[PredicateSet]
    chance: float


def prepare(cfg: FaithfulnessConfig) -> FaithfulnessSetup:
    """Read the benchmark and predicates, build the counterfactual items (donors from the predicate file: the closed
    slice's sets when it holds a slice) and sample them by video."""
    from distill.narrate import read_predicates
    from distill.predicates import OracleIndex
    from distill.validator import read_denotations
    from eval.benchmark import Benchmark

    bench = Benchmark.load(cfg.data)
    members = {s: list(p) for s, p in OracleIndex(bench, use_sim=False).members.items()}
    everything = read_predicates(cfg.predicates)
    split_ids = None if cfg.split is None else set(bench.query_field("id", cfg.split))
    sets = [ps for ps in everything if split_ids is None or ps.query_id in split_ids]
    if not sets:
        raise InputError(f"{cfg.predicates}: no predicate sets for split {cfg.split!r}")
    video = bench.query_field("video_id")
    sets = [replace(ps, video_id=ps.video_id or video.get(ps.query_id, "")) for ps in sets]
    items, drops = build_items(sets, DonorPool(everything, read_denotations(bench.root)),
                               gold_rows=_narrated(cfg.rationales),
                               perturbed_rows=_narrated(cfg.perturbed), seed=cfg.seed)
    if not items:
        raise InputError(f"no query of split {cfg.split!r} has a counterfactual rationale ({drops})")
    sampled = sample_by_video(items, lambda it: it.ps.video_id, cfg.limit, cfg.seed)
    return FaithfulnessSetup(bench, sampled, items, drops, members, sets,
                             1.0 / len({ps.answer for ps in everything}))


def evaluate(setup: FaithfulnessSetup, cfg: FaithfulnessConfig, backend) -> list[dict[str, Any]]:
    """Decode every condition of every item with ``backend`` (the student); per-query records (`_record`)."""
    from tqdm.auto import tqdm

    from distill.evidence import EvidenceIndex, student_request, student_template
    from forecasters.backends import SamplingParams
    from forecasters.media import FrameCache

    bench, items = setup.bench, setup.items
    template = student_template(cfg.student_input or "frames")
    frames = FrameCache(bench.root, max_pixels=cfg.max_pixels)
    index = EvidenceIndex(bench) if cfg.student_input == "evidence" else None
    foreign = shuffled_bodies(items, cfg.seed) if len(items) > 1 else None
    conditions = CONDITIONS if foreign else CONDITIONS[:3]
    per_query = []
    bar = tqdm(total=len(items), unit="q", desc="faithfulness", disable=not cfg.progress)
    try:
        for start in range(0, len(items), cfg.batch_size):
            chunk = items[start:start + cfg.batch_size]
            reqs = []
            for k, it in enumerate(chunk, start=start):
                req = student_request(bench.query(it.ps.query_id), bench, student_input=cfg.student_input or "frames",
                                      template=template, frame_cache=frames, frames=cfg.frames, index=index,
                                      sampling=SamplingParams())
                prefixes = {"gold": f"{it.gold}\nAnswer:", "perturbed": f"{it.perturbed}\nAnswer:",
                            "none": "Answer:", "shuffled": f"{foreign[k]}\nAnswer:" if foreign else ""}
                reqs += [(req, prefixes[c]) for c in conditions]
            answers = _decode(backend, reqs, cfg.max_new_tokens)
            m = len(conditions)
            for i, it in enumerate(chunk):
                per_query.append(_record(it, dict(zip(conditions, answers[m * i:m * i + m], strict=True)),
                                         setup.members))
            bar.update(len(chunk))
    finally:
        bar.close()
    return per_query


def counts(setup: FaithfulnessSetup, per_query: list[dict[str, Any]]) -> dict[str, Any]:
    sets, drops = setup.sets, setup.drops
    return {"in_split": len(sets), **drops, "eligible": len(sets) - sum(drops.values()),
            "evaluated": len({r["query_id"] for r in per_query}),
            "videos_in_split": len({ps.video_id for ps in sets}),
            "videos_evaluated": len({r["video_id"] for r in per_query}),
            "tiers": {t: sum(r["tier"] == t for r in per_query) for t in {r["tier"] for r in per_query}},
            "eligible_by_qtype": _eligible_by_qtype(sets, setup.eligible)}


def run_faithfulness(cfg: FaithfulnessConfig, backend=None) -> dict[str, Any]:
    """Run the check (see the module docstring); returns the summary written to ``faithfulness.json``."""
    from distill.config import write_resolved
    from eval.io import write_json, write_jsonl

    t0 = time.perf_counter()
    cfg = resolve_preprocessing(cfg)
    setup = prepare(cfg)
    own = backend is None
    backend = _student(cfg) if own else backend
    try:
        per_query = evaluate(setup, cfg, backend)
    finally:
        if own:
            backend.close()
    summary = summarize(per_query, n_resamples=cfg.resamples, seed=cfg.seed, chance=setup.chance)
    summary["counts"] = counts(setup, per_query)
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    out = Path(cfg.out)
    write_jsonl(out / "faithfulness.jsonl", per_query)
    write_json(out / "faithfulness.json", summary)
    (out / "faithfulness.md").write_text(to_markdown(summary), encoding="utf-8")
    write_resolved(cfg, out / "faithfulness.config.json")
    return summary


@dataclass
class CounterfactualsConfig:
    """``python -m distill counterfactuals``: the counterfactual predicate set of every query (JSONL), for a teacher
    to narrate (``python -m distill narrate --predicates OUT``) and ``faithfulness --perturbed`` to use."""

    predicates: str = field(metadata={"help": "predicates JSONL (python -m distill predicates)"})
    out: str = field(metadata={"help": "counterfactual predicate sets to write (JSONL)"})
    seed: int = field(default=0, metadata={"help": "seed of the donor choice (use the faithfulness seed)"})
    data: str | None = field(default=None, metadata={
        "help": "benchmark directory: its sim/phrases.jsonl lets a Q4 donor match the anchor by what it says"})


def write_counterfactuals(cfg: CounterfactualsConfig) -> dict[str, Any]:
    """Write the counterfactual sets (queries without a donor are left out and counted); returns a summary."""
    from distill.narrate import read_predicates
    from distill.validator import read_denotations
    from eval.io import write_jsonl

    sets = read_predicates(cfg.predicates)
    pool = DonorPool(sets, read_denotations(cfg.data) if cfg.data else None)
    tiers: dict[str, int] = defaultdict(int)

    def rows():
        for ps in sets:
            cf, tier = counterfactual_set(ps, pool, cfg.seed)
            tiers[tier or "no_donor"] += 1
            if cf is not None:
                yield cf.to_dict()

    n = write_jsonl(cfg.out, rows())
    return {"queries": len(sets), "written": n, "tiers": dict(tiers)}
