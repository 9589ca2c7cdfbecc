"""The benchmark card: the numbers that say whether a benchmark is PSR-shaped, beside the paper's.

``python -m eval card DIR [--out OUT]`` prints the card and writes ``OUT/card.md`` and ``OUT/card.json``.

Quantities (population: the main benchmark, question types Q1-Q4, unless said otherwise). A key names its unit:
``_pct`` percent (a recall, as every report prints R@k), ``_share`` a fraction in [0, 1], ``_s`` seconds; the
other values are counts, means of counts, the tail exponent, or the shares `label_quality` describes:

- ``segments``, ``states`` (canonical states carried by at least one segment), ``queries``, ``query videos``;
- segments per state: mean, median, the most frequent state's share of the corpus (``top share``), and the tail
  exponent ``s`` of the rank-size law ``n_r ~ r^-s`` (least squares of log size on log rank over all states);
- main-pool size as a share of the corpus: mean over the fair test queries of ``|in_dataset + cross_dataset| / N``;
- horizon mix: the share of queries at h = 1 .. 5 (h >= 6 folded into 5);
- prefix-to-target gap: the median of ``target_time - prefix_end`` (seconds);
- chance R@5 in percent, exact: a uniformly random ranking of the corpus minus the query's own video (``N_q`` items,
  ``g_q`` positives) hits at 5 with probability ``1 - C(N_q - g_q, 5) / C(N_q, 5)``; the mean over the fair test queries;
- the state-tie ceiling R@5 in percent (`state_tie_ceiling`), overall and (``extra``) by horizon: what knowing the
  target's canonical state, and nothing finer, can reach when the main pool is a budgeted subset of that state; and
  the same for the query's current state (`present_tie_ceiling`: persistence with perfect perception);
- where segments carry ``sim_state`` (the synthetic benchmark): the canonicalization's errors against the truth
  (`canonicalization_errors`), how true the labels are (`label_quality`: ``label_truth``,
  ``same_state_agreement``), the share of queries whose prefix ends in motion (`prefix_motion_share`), how much of
  the future the true present determines (`present_predictability`: ``<slot>_from_present_share``), and, when the
  construction recorded them, the mined pools' measured precision;
- the build fingerprint (`eval.fingerprint.build_fingerprint`): one hash of every record, so two builds (two machines,
  two thread counts) are compared by one line (`fingerprint_line`; the results page prints it too).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eval.benchmark import Benchmark
from eval.fingerprint import build_fingerprint, fingerprint_line
from eval.io import write_json
from eval.schema import MAIN_QTYPES, report_horizon

#: The paper's values (000 §3.2 and 001): what a PSR-shaped benchmark looks like.
PAPER = {"segments": 218_276, "states": 51_362, "queries": 20_182, "segments_per_state_mean": 218_276 / 51_362,
         "h1_share": 0.56, "gap_median_s": 1.9, "chance_r5_pct": 0.0}


@dataclass
class Card:
    """Every number of the card (``rows``: label -> value, ``paper``: label -> the paper's value)."""

    data: str
    name: str
    rows: dict[str, float | int | str] = field(default_factory=dict)
    paper: dict[str, float | int] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"data": self.data, "name": self.name, "values": self.rows, "paper": self.paper, **self.extra}

    def markdown(self) -> str:
        lines = [f"Benchmark card of `{self.name}` (`python -m eval card {self.data}`); the paper's values from its "
                 "§3.2 and appendix (PSR release).", "", "| quantity | this benchmark | PSR (paper) |", "|---|---:|---:|"]
        for k, v in self.rows.items():
            p = self.paper.get(k, "")
            lines.append(f"| {k} | {_fmt(v)} | {_fmt(p) if p != '' else ''} |")
        line = fingerprint_line(self.to_dict())
        return "\n".join(lines) + "\n" + (f"\n{line}\n" if line else "")


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def tail_exponent(sizes: np.ndarray) -> float:
    """``s`` of the rank-size law ``n_r ~ r^-s``: minus the least-squares slope of log size on log rank."""
    n = np.sort(np.asarray(sizes, np.float64))[::-1]
    n = n[n > 0]
    if len(n) < 2:
        return float("nan")
    r = np.arange(1, len(n) + 1, dtype=np.float64)
    slope = np.polyfit(np.log(r), np.log(n), 1)[0]
    return float(-slope)


def chance_recall(n_items: np.ndarray, n_pos: np.ndarray, k: int = 5) -> np.ndarray:
    """Exact hit@k of a uniformly random ranking: ``1 - C(N - g, k) / C(N, k)`` (``prod_{i<k} (N-g-i)/(N-i)``)."""
    n_items = np.asarray(n_items, np.float64)
    n_pos = np.asarray(n_pos, np.float64)
    miss = np.ones_like(n_items)
    for i in range(k):
        miss *= np.clip((n_items - n_pos - i) / np.maximum(n_items - i, 1), 0, 1)
    return np.where(n_pos > 0, 1 - miss, np.nan)


def state_tie_ceiling(bench: Benchmark, rows: np.ndarray, k: int = 5, states: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per query row: the exact expected hit@k of a ranking whose top is every segment of the query's target canonical
    state outside its video, tied (in a uniformly random order), and the number ``m`` of those segments. Returns
    ``(hit (n,), m (n,))``; ``hit`` is NaN where no main-pool positive lies in that state. ``states`` (one canonical
    state id per row; ``""`` for none) ties another state's segments instead of the target's: the query's current
    state makes it persistence with perfect perception (`present_tie_ceiling`).

    With ``g`` positives among the ``m`` segments, ``hit = 1 - C(m - g, k) / C(m, k)`` (1 when ``m - g < k``).
    Positives outside the tied state count as missed: they rank below the tie, and where ``m < k`` (the rest of the
    top k filled from below it) the value is a lower bound.

    A state-level score (a canonical state's text in a semantic space, as the semantic-text oracle's) ties every
    segment of a state, and the paper's mined pools are a budgeted subset of the state (`retrieval.canon.mining`): so
    the semantic-text oracle's R@k with expected ties is this ceiling (exactly, where every positive carries the
    target state), and a horizon whose targets lie in larger states has a lower one."""
    from eval.scoring import benchmark_groups

    rows = np.asarray(rows, np.int64)
    cd, qd = bench.corpus_ds, bench.queries_ds
    seg_state = np.asarray(cd["state_id"][:])
    seg_video = np.asarray(cd["video_id"][:])
    target = np.asarray(qd["target_state_id"][:])[rows] if states is None else np.asarray(states)
    video = np.asarray(qd["video_id"][:])[rows]
    pools = benchmark_groups(bench, bench.query_table(rows))[0]["type2-all"] if len(rows) else []
    by_state: dict[str, np.ndarray] = {}
    order = np.argsort(seg_state, kind="stable")
    names, starts = np.unique(seg_state[order], return_index=True)
    for s, a, b in zip(names, starts, [*starts[1:], len(order)], strict=True):
        by_state[str(s)] = order[a:b]
    hit, sizes = np.full(len(rows), np.nan), np.zeros(len(rows), np.int64)
    for i, (t, v, pos) in enumerate(zip(target, video, pools, strict=True)):
        segs = by_state.get(str(t), np.zeros(0, np.int64))
        segs = segs[seg_video[segs] != v]
        m, g = len(segs), int(np.isin(pos, segs).sum())
        sizes[i] = m
        if g:
            hit[i] = 1.0 if m - g < k else 1.0 - math.comb(m - g, k) / math.comb(m, k)
    return hit, sizes


def present_tie_ceiling(bench: Benchmark, rows: np.ndarray, k: int = 5) -> np.ndarray:
    """Per query row: the expected hit@k of persistence with perfect perception -- every segment of the query's
    current canonical state (its transcript entry at the prefix's end, `eval.segments.current_states`) tied first,
    in a random order -- 0 where the query has no current state or no positive lies in it. It reaches the state-tie
    ceiling where the target state is the current one, so its mean says how much persistence from frames could reach
    with the present perceived exactly."""
    from eval.segments import current_states

    rows = np.asarray(rows, np.int64)
    ids = np.asarray(bench.state_ids, dtype=object)
    current = current_states(bench)[rows]
    states = np.where(current >= 0, ids[np.maximum(current, 0)], "") if len(ids) else np.full(len(rows), "")
    return np.nan_to_num(state_tie_ceiling(bench, rows, k, states.astype(str))[0], nan=0.0)


def make_card(data: str | os.PathLike) -> Card:
    bench = Benchmark.load(data)
    qd, cd = bench.queries_ds, bench.corpus_ds
    card = Card(str(data), bench.manifest.name)
    seg_state = np.asarray(cd["state_id"][:], dtype=object)
    _, sizes = np.unique(seg_state.astype(str), return_counts=True)
    qtype = np.asarray(qd["qtype"][:])
    main = np.isin(qtype, MAIN_QTYPES)
    test = bench.query_rows("test", fair_only=True, qtypes=MAIN_QTYPES)
    seg_video = np.asarray(cd["video_id"][:])
    video_size = dict(zip(*np.unique(seg_video, return_counts=True), strict=True))
    q_video = np.asarray(qd["video_id"][:])
    n_items = len(cd) - np.array([video_size.get(v, 0) for v in q_video[test]])
    pools = qd.select(test)["gt_pools"][:] if len(test) else []
    n_pos = np.array([len(p["in_dataset"]) + len(p["cross_dataset"]) for p in pools], np.float64)
    horizon = np.array([report_horizon(h) for h in qd["horizon"][:]])[main]
    gap = (np.asarray(qd["target_time"][:], np.float64) - np.asarray(qd["prefix_end"][:], np.float64))[main]
    r = card.rows
    r["segments"] = int(len(cd))
    r["states"] = int(len(sizes))
    r["queries (Q1-Q4)"] = int(main.sum())
    r["queries Q5 (multi-object, scored apart)"] = int((qtype == "Q5").sum())
    r["query videos"] = int(len(np.unique(q_video)))
    r["segments_per_state_mean"] = float(sizes.mean())
    r["segments_per_state_median"] = float(np.median(sizes))
    r["top_state_share"] = float(sizes.max() / sizes.sum())
    r["tail_exponent"] = tail_exponent(sizes)
    r["fair_test_queries"] = int(len(test))
    r["main_pool_share_of_corpus"] = float(np.mean(n_pos / n_items)) if len(test) else float("nan")
    r["main_pool_mean_size"] = float(n_pos.mean()) if len(test) else float("nan")
    for h in range(1, 6):
        r[f"h{h}_share"] = float(np.mean(horizon == h)) if len(horizon) else float("nan")
    r["gap_median_s"] = float(np.median(gap)) if len(gap) else float("nan")
    r["chance_r5_pct"] = float(np.nanmean(chance_recall(n_items, n_pos))) * 100 if len(test) else float("nan")
    tie, tie_n = state_tie_ceiling(bench, test)
    tie = np.nan_to_num(tie, nan=0.0)  # no positive in the target state: the tie misses
    r["state_tie_ceiling_r5_pct"] = float(tie.mean()) * 100 if len(test) else float("nan")
    present = present_tie_ceiling(bench, test)
    r["present_state_tie_ceiling_r5_pct"] = float(present.mean()) * 100 if len(test) else float("nan")
    test_h = np.array([report_horizon(h) for h in qd.select(test)["horizon"][:]]) if len(test) else np.zeros(0)
    card.extra["state_tie_ceiling"] = {
        "k": 5, "r5_pct": r["state_tie_ceiling_r5_pct"], "present_r5_pct": r["present_state_tie_ceiling_r5_pct"],
        "by_horizon": {str(h): {"r5_pct": float(tie[test_h == h].mean()) * 100, "n": int((test_h == h).sum()),
                                "state_segments_median": float(np.median(tie_n[test_h == h])),
                                "present_r5_pct": float(present[test_h == h].mean()) * 100}
                       for h in range(1, 6) if (test_h == h).any()}}
    card.paper = {"segments": PAPER["segments"], "states": PAPER["states"], "queries (Q1-Q4)": PAPER["queries"],
                  "segments_per_state_mean": round(PAPER["segments_per_state_mean"], 2), "h1_share": PAPER["h1_share"],
                  "gap_median_s": PAPER["gap_median_s"], "chance_r5_pct": PAPER["chance_r5_pct"]}
    canon = bench.manifest.extra.get("canonicalization", {})
    if "sim_state" in cd.column_names and all(s is not None for s in cd["sim_state"][:1]):
        err = canonicalization_errors(seg_state.astype(str), np.asarray(cd["sim_state"][:], dtype=object).astype(str))
        r["true (simulator) states"] = err["true_states"]
        r["true states split across canonical states"] = err["split_true_states"]
        r["canonical states merging true states"] = err["merged_canonical_states"]
        card.extra["canonicalization_errors"] = err
        r.update(label_quality(bench))
        motion = prefix_motion_share(bench, main)
        if motion is not None:
            r["prefix_motion_share"] = motion
        r.update(present_predictability(bench))
    card.extra["build_fingerprint"] = build_fingerprint(bench)
    prec = (canon.get("mining") or {}).get("precision") or {}
    if prec.get("main") is not None:
        r["GT precision (main pool, measured)"] = float(prec["main"])
        card.paper["GT precision (main pool, measured)"] = 0.894
    return card


def label_quality(bench: Benchmark) -> dict[str, float]:
    """How true the canonical labels are of their segments (a benchmark whose segments carry ``sim_state``):

    - ``label_truth``: the share of segments whose true state *satisfies* their canonical state's text, i.e. agrees
      with every attribute value the text says (`eval.synth.lexicon.satisfies`, with the text's denotation from
      ``sim/phrases.jsonl``); texts without a recorded denotation are not counted;
    - ``same_state_agreement``: over all pairs of segments in the same true state, the share whose canonical states
      are the same, ``sum_t sum_c C(n_tc, 2) / sum_t C(n_t, 2)``.

    Empty when the benchmark has no ``sim/phrases.jsonl``."""
    path = bench.root / "sim" / "phrases.jsonl"
    if not path.exists():
        return {}
    den = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            den[row["phrase"]] = row["denotes"]
    cd = bench.corpus_ds
    return label_scores(cd["sim_state"][:], cd["state"][:], cd["state_id"][:], den)


def label_scores(truth, texts, state_ids, denotations: dict[str, dict]) -> dict[str, float]:
    """`label_quality` from per-segment arrays: true-state keys, canonical texts, canonical state ids, and the
    denotation of each text (texts without one are not counted in ``label_truth``)."""
    from eval.synth.lexicon import TrueState, satisfies

    truth = np.asarray(truth, dtype=object).astype(str)
    text = np.asarray(texts, dtype=object).astype(str)
    ok, counted = 0, 0
    for (t, s), n in zip(*np.unique(np.stack([truth, text], 1), axis=0, return_counts=True), strict=True):
        d = denotations.get(s)
        if d is None:
            continue
        counted += int(n)
        ok += int(n) * satisfies(TrueState.from_key(t), d)
    _, t_codes = np.unique(truth, return_inverse=True)
    _, c_codes = np.unique(np.asarray(state_ids, dtype=object).astype(str), return_inverse=True)
    _, n_tc = np.unique(np.stack([t_codes, c_codes], 1), axis=0, return_counts=True)
    n_t = np.bincount(t_codes)
    pairs = float((n_t * (n_t - 1) / 2).sum())
    return {"label_truth": ok / counted if counted else float("nan"),
            "same_state_agreement": float((n_tc * (n_tc - 1) / 2).sum()) / pairs if pairs else float("nan")}


def prefix_motion_share(bench: Benchmark, rows: np.ndarray) -> float | None:
    """The share of the queries ``rows`` (a bool mask) whose prefix ends while the scene is in motion around the
    queried object: it moves, or a moving body touches it or is on a collision course with it, in the last two
    prefix frames (`eval.synth.prefix.engaged`, on the simulator record ``sim/<video>.npz``). None without records."""
    from eval.synth import prefix as P
    from eval.synth.record import load_npz

    qd = bench.queries_ds
    video = np.asarray(qd["video_id"][:], dtype=object)[rows]
    obj = np.asarray(qd["object_id"][:], dtype=object)[rows]
    end = np.asarray(qd["prefix_end"][:], np.float64)[rows]
    if not len(video) or not (bench.root / "sim" / f"{video[0]}.npz").exists():
        return None
    hits = np.zeros(len(video), bool)
    for v in np.unique(video):
        rec = load_npz(bench.root / "sim" / f"{v}.npz")
        eng = P.engaged(rec)
        ids = [str(x) for x in rec.object_ids]
        for i in np.flatnonzero(video == v):
            hits[i] = eng[min(int(round(end[i] * rec.fps)), rec.n_frames - 1), ids.index(str(obj[i]))]
    return float(hits.mean())


#: The attributes of a true state (`eval.synth.lexicon.TrueState`), in key order.
SLOTS = ("motion", "place", "relation", "other", "pose")


def present_predictability(bench: Benchmark) -> dict[str, float]:
    """How much of the target the true present determines, per attribute and whole: over the fair test queries
    (Q1-Q4) whose main pool records its true state (``gt_sim_exact``), the share whose target's attribute (``state``:
    the whole true state) equals the most frequent one among the training queries of the same true current state
    (the object's segment at ``prefix_end``), question type and horizon -- falling back to the same current state,
    then to the question type and horizon (count ties to the lexically first value). A table of the present: a
    forecaster that perceives more than the present's label (speeds, distances) can exceed it, a label that is
    not decided by the scene before the prefix's end bounds every forecaster. Keys ``<attribute>_from_present_share``
    and ``state_from_present_share``; empty without ``sim_state``."""
    cd, qd = bench.corpus_ds, bench.queries_ds
    true_of = dict(zip(cd["id"][:], cd["sim_state"][:], strict=True))
    spans: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for v, o, s, e, t in zip(cd["video_id"][:], cd["object_id"][:], cd["start"][:], cd["end"][:], cd["sim_state"][:],
                             strict=True):
        spans.setdefault((v, o), []).append((float(s), float(e), str(t)))
    rows = []
    for q in qd.select_columns(["qtype", "horizon", "split", "fair", "video_id", "object_id", "prefix_end",
                                "gt_sim_exact"]):
        if q["qtype"] not in MAIN_QTYPES or q["split"] not in ("train", "test") or not q["gt_sim_exact"]:
            continue
        if q["split"] == "test" and not q["fair"]:
            continue
        end = float(q["prefix_end"]) + 1e-6
        now = [t for s, e, t in spans.get((q["video_id"], q["object_id"]), []) if s <= end < e + 1e-6]
        if now:
            rows.append((q["split"], now[-1], q["qtype"], int(q["horizon"]), str(true_of[q["gt_sim_exact"][0]])))
    train = [r[1:] for r in rows if r[0] == "train"]
    test = [r[1:] for r in rows if r[0] == "test"]
    return present_table_shares(train, test) if test else {}


def present_table_shares(train: list[tuple[str, str, int, str]], test: list[tuple[str, str, int, str]]
                         ) -> dict[str, float]:
    """`present_predictability` from ``(current true key, question type, horizon, target true key)`` rows."""
    from collections import Counter

    out = {}
    for i, name in [*enumerate(SLOTS), (-1, "state")]:
        def value(key: str, i: int = i) -> str:
            return key if i < 0 else key.split("|")[i]

        tables: list[dict] = [{}, {}, {}]
        for now, qt, h, target in train:
            for table, key in zip(tables, ((now, qt, h), (now,), (qt, h)), strict=True):
                table.setdefault(key, Counter())[value(target)] += 1
        hits = 0
        for now, qt, h, target in test:
            for table, key in zip(tables, ((now, qt, h), (now,), (qt, h)), strict=True):
                if key in table:
                    best = min(table[key].items(), key=lambda kv: (-kv[1], kv[0]))[0]
                    hits += best == value(target)
                    break
        out[f"{name}_from_present_share"] = hits / len(test)
    return out


def canonicalization_errors(canonical, truth) -> dict[str, float]:
    """How canonical states (one label per segment) partition the true states (one label per segment).

    - ``split_true_states``: share of true states (with >= 2 segments) whose segments fall into >= 2 canonical states;
    - ``split_segments``: share of segments outside their true state's most common canonical state;
    - ``merged_canonical_states``: share of canonical states (with >= 2 segments) holding >= 2 true states;
    - ``merged_segments``: share of segments outside their canonical state's most common true state;
    - ``true_states`` / ``canonical_states``: the counts compared.
    """
    _, c = np.unique(np.asarray(canonical), return_inverse=True)
    _, t = np.unique(np.asarray(truth), return_inverse=True)
    pairs = np.unique(np.stack([c, t], 1), axis=0)
    split_t, split_s = _spread(t, c, pairs[:, 1])
    merged_c, merged_s = _spread(c, t, pairs[:, 0])
    return {"true_states": int(t.max() + 1) if len(t) else 0, "canonical_states": int(c.max() + 1) if len(c) else 0,
            "split_true_states": split_t, "split_segments": split_s,
            "merged_canonical_states": merged_c, "merged_segments": merged_s}


def _spread(a: np.ndarray, b: np.ndarray, a_of_pairs: np.ndarray) -> tuple[float, float]:
    """(share of ``a``-groups with >= 2 segments that hold >= 2 values of ``b``, share of segments outside their
    ``a``-group's most common ``b``); ``a_of_pairs``: the ``a`` code of each distinct (a, b) pair."""
    n_per = np.bincount(a)
    partners = np.bincount(a_of_pairs, minlength=len(n_per))
    eligible = n_per >= 2
    frac = float((partners[eligible] >= 2).mean()) if eligible.any() else 0.0
    key = a.astype(np.int64) * (int(b.max()) + 1) + b
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    best = np.zeros(len(n_per), np.int64)
    np.maximum.at(best, a, cnt[inv])
    return frac, float(1 - best.sum() / len(a))


OUTPUT_KIND = "eval card"


def write_card(card: Card, out: str | os.PathLike, *, overwrite: bool = False) -> tuple[Path, Path]:
    """``out/card.md`` and ``out/card.json``, written as one output folder (`eval.io.atomic_dir`: only a previous
    card folder is replaced, never the benchmark)."""
    from eval.io import atomic_dir

    out = Path(out)
    with atomic_dir(out, kind=OUTPUT_KIND, inputs=[card.data], overwrite=overwrite) as stage:
        (stage / "card.md").write_text(card.markdown(), encoding="utf-8")
        write_json(stage / "card.json", json.loads(json.dumps(card.to_dict(), default=float)))
    return out / "card.md", out / "card.json"
