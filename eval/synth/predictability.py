"""How much of each answer the world decides at the prefix's end: the synthetic benchmark's predictability ceiling.

``lftr-sim`` (LFTR reading `eval.synth.simspace`, the simulator's exact state) measures what one forecaster *learns*
from perfect perception. This module measures what *any* forecaster could reach, whatever it learns. It re-simulates
each query's video with a perturbation applied just after the prefix's last frame, and asks the query's question of
the perturbed run:

- **The perturbation** (`Perturbation`). Every object in the world (not one still held by the gripper) is moved by a
  normal draw of ``pos_sd`` world units in x and in y, and its velocity components and spin are each scaled by
  ``1 + N(0, vel_sd)``. The world is 400 units wide. The prefix itself is untouched: the perturbation lands in the
  physics step after the last prefix frame is recorded.
- **The answer** (`answer`), by each question's definition in `eval.synth.build`:
  - Q1 (next state): the first segment that starts after the prefix's last frame;
  - Q2 (end state): the last segment;
  - Q3 (the state ``k`` seconds after the prefix): the segment active at the prefix's end + ``k``;
  - Q4 (the state just before a named later state): the segment before the first one after the prefix in the
    anchor's true state. The anchor is the state that follows the target in the original run.
- **Kept**: the perturbed answer's true state (`eval.synth.lexicon.TrueState.key`) equals the original answer's.

With no perturbation every answer is kept: the simulator is deterministic. `measure` checks two things before it
perturbs anything. The unperturbed re-simulation must reproduce the build's stored record (``sim/<video>.npz``), and
`answer` must give every query's target segment. A benchmark built by another version of the simulator is refused.

The share kept under a perturbation far below what frames resolve is the share of answers that the present decides.
The rest is the world's own uncertainty: chaos, where a small difference grows into another outcome.

**The ceiling in R@5** (`ceiling_r5`). Take a forecaster that foresees the perturbed run's answer and names the label
most of that true state's corpus segments carry (its *usual* canonical state). It ranks that state's segments first.
- When the label is the target's canonical state, its expected hit@5 is the query's naming-the-state value
  (`naming_the_state`).
- Otherwise it is 0, because every main-pool positive carries the target's canonical state.

Averaged over the main table's population (the split's fair Q1-Q4 queries), this is the R@5 of perfect foresight up
to the perturbation. With no perturbation it is the labels' own limit: a forecaster that knows the future true state,
but not which description its segment happened to get.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.schema import MAIN_QTYPES

MAIN_LEVELS = ("0:0", "0.2:0.01", "1:0.05")
"""The default perturbations (``pos_sd:vel_sd``): none, then two far below a pixel of the demo's frames."""
QTYPES = ("Q1", "Q2", "Q3", "Q4")
"""The question types `answer` knows (Q5 asks several objects at once and is scored apart)."""


@dataclass(frozen=True)
class Perturbation:
    """A perturbation at the prefix's end: ``pos_sd`` world units of position noise, ``vel_sd`` relative velocity
    and spin noise (module docstring)."""

    pos_sd: float = 0.0
    vel_sd: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Perturbation:
        """``"POS_SD:VEL_SD"`` (``"0.2:0.01"``) -> a `Perturbation`; a clear error otherwise."""
        parts = text.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            pos, vel = float(parts[0]), float(parts[1])
        except ValueError:
            raise InputError(f"perturbation {text!r}: expected POS_SD:VEL_SD, e.g. 0.2:0.01") from None
        if not (math.isfinite(pos) and math.isfinite(vel)) or pos < 0 or vel < 0:
            raise InputError(f"perturbation {text!r}: both parts must be finite and >= 0")
        return cls(pos, vel)

    @property
    def label(self) -> str:
        return f"{self.pos_sd:g}:{self.vel_sd:g}"

    @property
    def key(self) -> tuple[int, int]:
        """The level's part of its draws' seed (micro-units), so a level draws the same whatever list it is in."""
        return round(self.pos_sd * 1e6), round(self.vel_sd * 1e6)

    @property
    def none(self) -> bool:
        return self.pos_sd == 0 and self.vel_sd == 0

    def hook(self, rng: np.random.Generator) -> Callable:
        """``fn(world)`` applying this perturbation to every object in the world, draws from ``rng``."""
        def apply(world) -> None:
            for body, present in zip(world.bodies, world.in_space, strict=True):
                if not present:
                    continue
                x, y = body.position
                vx, vy = body.velocity
                dx, dy, sx, sy, sw = rng.normal(0.0, 1.0, 5)
                body.position = (x + self.pos_sd * dx, y + self.pos_sd * dy)
                body.velocity = (vx * (1 + self.vel_sd * sx), vy * (1 + self.vel_sd * sy))
                body.angular_velocity *= 1 + self.vel_sd * sw
        return apply


@dataclass(frozen=True)
class Question:
    """What `answer` needs of one query: its type, the prefix's last frame, ``k`` (Q3) and the anchor's key (Q4)."""

    qtype: str
    end_frame: int
    k_seconds: float | None = None
    anchor: str | None = None


def answer(traj: Sequence, q: Question, fps: float) -> str | None:
    """The true-state key of ``q``'s answer in one object's trajectory (`eval.synth.states.StateSegment` list, time
    order); None when the trajectory has none (no state after the prefix; Q4: the anchor is never reached)."""
    if q.qtype == "Q2":
        return traj[-1].state.key
    after = [i for i, s in enumerate(traj) if s.start > q.end_frame]
    if q.qtype == "Q1":
        return traj[after[0]].state.key if after else None
    if q.qtype == "Q3":
        f = q.end_frame + int(round(float(q.k_seconds or 0.0) * fps))
        return next((s.state.key for s in traj if s.start <= f < s.stop), traj[-1].state.key)
    if q.qtype == "Q4":
        return next((traj[i - 1].state.key for i in after if i > 0 and traj[i].state.key == q.anchor), None)
    raise InputError(f"question type {q.qtype!r} has no answer rule here; expected one of {QTYPES}")


@dataclass(frozen=True)
class _Prefix:
    """One prefix's questions: the object, the prefix's last frame, (query id, question, original answer key)."""

    object_id: str
    end_frame: int
    questions: tuple[tuple[str, Question, str], ...]


def _video_job(root: str, seed: int, index: int, domain: str, video: str, prefixes: tuple[_Prefix, ...],
               levels: tuple[Perturbation, ...]) -> tuple[str, float, list[tuple[str, int, str | None]]]:
    """The video's scene family, its camera zoom (pixels per world unit at 160 pixels wide) and (query id, level
    index, answer key) for every question of the video under every level."""
    from eval.synth import record as R
    from eval.synth import states
    from eval.synth.video import simulate_video

    base = simulate_video(seed, index, domain).record
    stored = Path(root) / "sim" / f"{video}.npz"
    if not stored.is_file():
        raise InputError(f"{stored}: missing; the predictability measure re-simulates the build's videos")
    if not np.array_equal(R.load_npz(stored).pos, base.pos):
        raise InputError(f"{stored}: this simulator does not reproduce video {video} (index {index} of seed {seed}); "
                         f"the benchmark was built by another version of eval.synth: rebuild it to measure it")
    ids = [str(x) for x in base.object_ids]
    unperturbed = states.trajectories(base)
    out = []
    for p in prefixes:
        k = ids.index(p.object_id)
        for qid, q, key in p.questions:
            got = answer(unperturbed[k], q, base.fps)
            if got != key:
                raise InputError(f"query {qid}: the answer rule gives {got!r} on the unperturbed run, the build "
                                 f"says {key!r}; eval.synth.predictability.answer no longer matches eval.synth.build")
        for li, level in enumerate(levels):
            if level.none:
                traj = unperturbed[k]
            else:
                rng = np.random.default_rng([seed, index, k, *level.key, 0x9E7])
                hook = level.hook(rng)
                rec = simulate_video(seed, index, domain, hooks=((p.end_frame / base.fps, hook),)).record
                traj = states.trajectories(rec)[k]
            out += [(qid, li, answer(traj, q, base.fps)) for qid, q, _ in p.questions]
    return str(base.family), float(base.camera[2]), out


def _video_job_star(args: tuple) -> tuple[str, float, list[tuple[str, int, str | None]]]:
    return _video_job(*args)


def naming_the_state(bench, rows: np.ndarray, k: int = 5) -> np.ndarray:
    """Per query row: the expected hit@k of a ranking whose top is every segment of the target's canonical state
    outside the query's video, tied; NaN where no main-pool positive lies in that state (`eval.card.state_tie_ceiling`,
    which the card averages by horizon)."""
    from eval.card import state_tie_ceiling

    return state_tie_ceiling(bench, rows, k)[0]


def usual_labels(bench) -> dict[str, str]:
    """True-state key -> the canonical state most of its corpus segments carry (ties: the smaller state id)."""
    keys = np.asarray(bench.corpus_ds["sim_state"][:])
    labels = np.asarray(bench.corpus_ds["state_id"][:])
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for key, label in zip(keys, labels, strict=True):
        if key:
            counts[str(key)][str(label)] += 1
    return {key: min(c, key=lambda s: (-c[s], s)) for key, c in counts.items()}


@dataclass
class Measurement:
    """Per level, per query: the perturbed answer and whether it kept the original's true state; and the R@5 a
    forecaster naming its usual label reaches (`ceiling_r5`)."""

    levels: tuple[Perturbation, ...]
    query_ids: list[str]
    qtypes: list[str]
    horizons: list[int]
    families: list[str]
    originals: list[str]
    answers: list[list[str | None]]  # [level][query]
    naming: np.ndarray  # (n,) naming-the-state hit@5, 0 where no positive lies in the target's state
    label_hit: np.ndarray  # (levels, n) bool: the usual label of the perturbed answer is the target's state
    px_per_unit: float = float("nan")  # median image scale of the measured videos' frames

    def kept(self, level: int) -> np.ndarray:
        return np.array([a == o for a, o in zip(self.answers[level], self.originals, strict=True)])

    def ceiling_r5(self, level: int) -> float:
        return 100 * float(np.mean(self.naming * self.label_hit[level])) if len(self.naming) else float("nan")

    @property
    def naming_r5(self) -> float:
        """R@5 of naming every query's target state (the semantic-text oracle's, up to positives outside it)."""
        return 100 * float(np.mean(self.naming)) if len(self.naming) else float("nan")

    def summary(self) -> dict:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (qt, h) in enumerate(zip(self.qtypes, self.horizons, strict=True)):
            groups[f"{qt} h{min(h, 3)}{'+' if h >= 3 else ''}"].append(i)
        fam: dict[str, list[int]] = defaultdict(list)
        for i, f in enumerate(self.families):
            fam[f].append(i)
        out = {"queries": len(self.query_ids), "naming_the_state_r5": self.naming_r5,
               "px_per_unit": self.px_per_unit, "levels": []}
        for li, level in enumerate(self.levels):
            kept = self.kept(li)
            out["levels"].append({
                "perturbation": level.label, "pos_sd": level.pos_sd, "vel_sd": level.vel_sd,
                "kept": float(kept.mean()) if len(kept) else float("nan"),
                "ceiling_r5": self.ceiling_r5(li),
                "by_question": {g: {"n": len(ix), "kept": float(kept[ix].mean())} for g, ix in sorted(groups.items())},
                "by_family": {f: {"n": len(ix), "kept": float(kept[ix].mean())} for f, ix in sorted(fam.items())}})
        return out


def _segments_by_object(bench) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
    cd = bench.corpus_ds
    cols = [np.asarray(cd[c][:]) for c in ("video_id", "object_id", "start", "end", "sim_state")]
    out: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for v, o, s, e, key in zip(*cols, strict=True):
        out[(str(v), str(o))].append((float(s), float(e), str(key)))
    for segs in out.values():
        segs.sort()
    return out


def measure(data: str | Path, levels: Sequence[Perturbation], *, split: str = "test", workers: int | None = None,
            progress: bool = True) -> Measurement:
    """Re-simulate every video with a main-table query of ``split`` (fair, Q1-Q4) under each of ``levels`` and
    collect the answers (module docstring). Needs a synthetic benchmark: its manifest's seed and video count, its
    segments' ``sim_state`` and its ``sim/`` records."""
    import os

    from tqdm.auto import tqdm

    from eval.benchmark import Benchmark
    from eval.pools import process_pool
    from eval.synth.video import video_id

    if not levels:
        raise InputError("give at least one perturbation level")
    bench = Benchmark.load(data)
    extra = bench.manifest.extra or {}
    if "seed" not in extra or "videos" not in extra or "sim_state" not in bench.corpus_ds.column_names:
        raise InputError(f"{data}: not a synthetic benchmark (its manifest has no extra.seed / extra.videos, or its "
                         f"corpus no sim_state); the predictability measure re-simulates eval.synth builds only")
    seed, n_videos = int(extra["seed"]), int(extra["videos"])
    index = {video_id(seed, i): i for i in range(n_videos)}
    rows = bench.query_rows(split, fair_only=True, qtypes=MAIN_QTYPES)
    if not len(rows):
        raise InputError(f"{data}: no fair Q1-Q4 queries in split {split!r}")
    qd = bench.queries_ds
    cols = {c: qd[c][:] for c in ("id", "video_id", "object_id", "domain", "qtype", "horizon", "prefix_end",
                                  "target_time", "k_seconds")}
    segs = _segments_by_object(bench)
    fps = float(extra.get("fps", 20.0))
    by_prefix: dict[tuple[str, str, int], list[tuple[str, Question, str]]] = defaultdict(list)
    meta: dict[str, tuple[str, int, str]] = {}
    for r in rows:
        qid, v, o = str(cols["id"][r]), str(cols["video_id"][r]), str(cols["object_id"][r])
        if v not in index:
            raise InputError(f"query {qid}: video {v} is not one of the {n_videos} videos of seed {seed}")
        trajectory = segs[(v, o)]
        t = float(cols["target_time"][r])
        j = next((i for i, (s, e, _) in enumerate(trajectory) if s <= t < e), len(trajectory) - 1)
        qtype = str(cols["qtype"][r])
        end = int(round(float(cols["prefix_end"][r]) * fps))
        anchor = trajectory[j + 1][2] if qtype == "Q4" and j + 1 < len(trajectory) else None
        k = cols["k_seconds"][r]
        by_prefix[(v, o, end)].append((qid, Question(qtype, end, None if k is None else float(k), anchor),
                                       trajectory[j][2]))
        meta[qid] = (qtype, int(cols["horizon"][r]), trajectory[j][2])
    videos: dict[str, list[_Prefix]] = defaultdict(list)
    domain_of = {str(cols["video_id"][r]): str(cols["domain"][r]) for r in rows}
    for (v, o, end), qs in by_prefix.items():
        videos[v].append(_Prefix(o, end, tuple(qs)))
    levels = tuple(levels)
    jobs = [(str(bench.root), seed, index[v], domain_of[v], v, tuple(ps), levels)
            for v, ps in sorted(videos.items(), key=lambda kv: index[kv[0]])]
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    results: dict[tuple[str, int], str | None] = {}
    family: dict[str, str] = {}
    zoom: list[float] = []
    bar = tqdm(total=len(jobs), desc="re-simulating videos", unit="video", disable=not progress)
    with contextlib.ExitStack() as stack:
        if n_workers == 1:
            parts = map(_video_job_star, jobs)
        else:
            parts = stack.enter_context(process_pool(n_workers)).map(_video_job_star, jobs, chunksize=4)
        for job, (fam, z, part) in zip(jobs, parts, strict=True):
            family[job[4]] = fam
            zoom.append(z)
            results.update({(q, li): a for q, li, a in part})
            bar.update()
    bar.close()
    qids = [str(cols["id"][r]) for r in rows]
    # the frames' scale: the camera's zoom is pixels per world unit at 160 pixels wide (eval.synth.render.Renderer)
    px_per_unit = float(np.median(zoom)) * int((extra.get("image_size") or [160])[0]) / 160.0
    labels = usual_labels(bench)
    target = np.asarray(qd["target_state_id"][:])[rows]
    naming = np.nan_to_num(naming_the_state(bench, rows), nan=0.0)
    answers = [[results[(q, li)] for q in qids] for li in range(len(levels))]
    label_hit = np.array([[a is not None and labels.get(a) == str(t) for a, t in zip(ans, target, strict=True)]
                          for ans in answers], bool).reshape(len(levels), len(qids))
    return Measurement(levels, qids, [meta[q][0] for q in qids], [meta[q][1] for q in qids],
                       [family[str(cols["video_id"][r])] for r in rows], [meta[q][2] for q in qids], answers,
                       naming, label_hit, px_per_unit)


def markdown(m: Measurement) -> str:
    """The measurement as Markdown tables: per level, the share kept and the ceiling R@5; kept by question and by
    scene family."""
    s = m.summary()
    lines = ["| perturbation (position sd, units : velocity sd, relative) | answers kept | ceiling R@5 | "
             "share of naming the state |", "|---|---:|---:|---:|"]
    for lv in s["levels"]:
        share = lv["ceiling_r5"] / s["naming_the_state_r5"] if s["naming_the_state_r5"] else float("nan")
        lines.append(f"| {lv['perturbation']} | {100 * lv['kept']:.1f}% | {lv['ceiling_r5']:.2f} | {100 * share:.0f}% |")
    lines += ["", f"Naming the target's state (every segment of it outside the query's video tied at the top): R@5 "
                  f"{s['naming_the_state_r5']:.2f} over {s['queries']:,} queries. The frames of these videos show "
                  f"{s['px_per_unit']:.2f} pixels per world unit (median), so a position sd of 1 unit is "
                  f"{s['px_per_unit']:.2f} px."]
    lines += _kept_table(s["levels"], "by_question", "Answers kept, by question and horizon:")
    lines += _kept_table(s["levels"], "by_family", "Answers kept, by scene family:")
    return "\n".join(lines) + "\n"


def _kept_table(levels: list[dict], key: str, title: str) -> list[str]:
    """Markdown lines: one row per level, one column per group of ``key`` (with its query count), cells the share
    of answers kept."""
    cols = sorted({g for lv in levels for g in lv[key]})
    out = ["", title, "", "| perturbation | " + " | ".join(f"{g} (n={levels[0][key][g]['n']})" for g in cols) + " |",
           "|---|" + "---:|" * len(cols)]
    out += [f"| {lv['perturbation']} | " + " | ".join(f"{100 * lv[key][g]['kept']:.0f}%" for g in cols) + " |"
            for lv in levels]
    return out


OUTPUT_KIND = "eval predictability"
DOC_TITLE = "# The predictability ceiling of the synthetic benchmark"


def _is_our_doc(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return text.startswith(DOC_TITLE) and "Generated by `python -m eval predictability" in text


def check_outputs(data: str | Path, out: str | Path, doc: str | Path | None, *, overwrite: bool = False) -> None:
    """Refuse, before any work, an ``out`` folder or ``doc`` file that this command may not replace (`eval.outputs`:
    only its own earlier outputs, never the benchmark)."""
    from eval.outputs import check_output_dir, check_output_file

    check_output_dir(out, OUTPUT_KIND, inputs=[data], overwrite=overwrite)
    if doc is not None:
        check_output_file(doc, OUTPUT_KIND, recognise=_is_our_doc, inputs=[data], overwrite=overwrite, option="--doc")


def write_outputs(m: Measurement, data: str | Path, out: str | Path, doc: str | Path | None, *, split: str,
                  overwrite: bool = False) -> str:
    """``out/predictability.json`` (the summary and every query's answers) and ``out/predictability.md``, written as
    one output folder; ``doc``: the Markdown again, headed by the command that made it. Returns the Markdown."""
    import shlex
    import sys

    from eval.atomic import atomic_path
    from eval.io import atomic_dir, write_json

    md = markdown(m)
    summary = {**m.summary(), "data": str(data), "split": split,
               "per_query": {"ids": m.query_ids, "original": m.originals,
                             "answers": {lv.label: ans for lv, ans in zip(m.levels, m.answers, strict=True)}}}
    with atomic_dir(out, kind=OUTPUT_KIND, inputs=[data], overwrite=overwrite) as stage:
        write_json(stage / "predictability.json", summary)
        (stage / "predictability.md").write_text(md, encoding="utf-8")
    if doc is not None:
        check_outputs(data, out, doc, overwrite=overwrite)
        command = shlex.join(["python", "-m", "eval", "predictability", *sys.argv[2:]])
        text = (f"{DOC_TITLE}\n\nGenerated by `{command}`; do not edit by hand: rerun the command to regenerate. "
                f"Benchmark `{data}`, split `{split}`: its fair Q1-Q4 queries (the main table's population). What is "
                "measured and how: `eval/synth/predictability.py`.\n\n" + md)
        with atomic_path(doc) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return md
