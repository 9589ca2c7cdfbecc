"""Findings computed from a report (and a benchmark card): what the numbers say, never typed in by hand.

`calibration` checks a synthetic benchmark's difficulty against the targets that make it PSR-shaped (each a line:
quantity, target, measured, met or not; with the card, its label-truth, motion, size and shape targets too);
`ceiling` is the ceiling decomposition (semantic oracle -> perfect-perception LFTR -> LFTR from frames); `findings`
states the headline comparisons of a demo report (fusion against the best single space, each learned method's
decline over horizons, the oracle ceiling). They read only
``report.json`` (`eval.report`), ``card.json`` (`eval.card`) and, for the learned visual spaces' check, the spaces'
geometry in ``complementarity.json`` (`retrieval.complementarity`); ``python -m eval findings REPORT_DIR [--card ...]
[--complementarity ...]`` prints them. Runs are recognised by their names' prefixes (`ROLES`), as `retrieval demo`
names them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

#: Run-name prefixes of the roles the checks need (first match wins). A run named with a seed suffix
#: (``lftr[minilm]-seed1``, `eval.runs.seed_group`) belongs to its group; a group's value is its seeds' mean.
ROLES = {
    "random": ("random",), "lookup": ("lookup",), "persistence": ("persistence",),
    "transition": ("transition-table",),
    "independent": ("independent-appearance", "oracle-independent-appearance"),
    "semantic": ("semantic-text", "oracle-semantic-text"), "paraphrase": ("paraphrase", "oracle-paraphrase"),
    "fusion": ("lftr-fusion",), "lftr": ("lftr[",), "perfect": ("lftr-sim[",),
    "classifier": ("state-classifier-sim[",),
    "perceived": ("lftr-perceiver[",),  # LFTR from frames through a supervised perceiver (`retrieval.perceiver`)
    "perceived-fusion": ("lftr-perceiver-fusion[",),  # the fusion of two heads through the perceiver
}
SIG_LEVEL = 0.01
#: The synthetic benchmark's targets on its card (key, label, low, high; None = unbounded).
CARD_TARGETS = (
    ("label_truth", "label truth (segments whose true state satisfies their canonical state)", 0.90, None),
    ("same_state_agreement", "same-true-state pairs sharing a canonical state", 0.60, None),
    ("prefix_motion_share", "queries whose prefix ends in motion around the object", 0.80, None),
    ("fair_test_queries", "fair test queries (Q1-Q4)", 2000, None),
    ("chance_r5_pct", "chance R@5 (%)", None, 1.0),
    ("top_state_share", "top state's share of the corpus", None, 0.03),
    ("h1_share", "h1 share", 0.50, 0.60),
    ("gap_median_s", "median prefix-to-target gap (s)", 1.0, 2.5),
)
#: The ceiling decomposition: perfect-perception LFTR as a share of the semantic oracle, LFTR from frames as a
#: share of perfect-perception LFTR.
PERFECT_SHARE = (0.30, 0.70)
FRAMES_SHARE = 0.40
#: A learned visual space must be a space: its items' effective dimension at least this share of its width, and its
#: state-prototype oracle at least that of the fixed pixel space (`REFERENCE_SPACE`), which learns nothing.
EFFECTIVE_SHARE = 0.25
REFERENCE_SPACE = "pixels"


@dataclass(frozen=True)
class Check:
    quantity: str
    target: str
    measured: str
    met: bool | None  # None: not measurable from this report

    def line(self) -> str:
        mark = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"| {self.quantity} | {self.target} | {self.measured} | {mark} |"


def groups(report: dict) -> dict[str, list[str]]:
    """Group name -> its run names, in report order: a multi-seed entry is one group (its name without the seed
    suffix), every other run its own."""
    from eval.runs import seed_group

    out: dict[str, list[str]] = {}
    entries = report.get("entries") or [{"names": [n]} for n in report["runs"]]
    for e in entries:
        names = [n for n in e["names"] if n in report["runs"]]
        if names:
            out[seed_group(names[0])[0] if len(names) > 1 else names[0]] = names
    return out


def _find(report: dict, role: str) -> list[str]:
    return [g for g in groups(report) if g.startswith(ROLES[role])]


def _values(report: dict, group: str, key=lambda r: r["main"]["R@5"]) -> list[float]:
    return [100 * key(report["runs"][n]) for n in groups(report)[group]]


def _r5(report: dict, group: str) -> float:
    v = _values(report, group)
    return sum(v) / len(v)


def _fmt_r5(report: dict, group: str) -> str:
    import statistics

    v = _values(report, group)
    return f"{sum(v) / len(v):.2f}" + (f" ± {statistics.stdev(v):.2f} ({len(v)} seeds)" if len(v) > 1 else "")


def _by_h(report: dict, group: str) -> dict[int, float]:
    """R@5 x100 by horizon, the mean over the group's runs."""
    acc: dict[int, list[float]] = {}
    for n in groups(report)[group]:
        for h, v in report["runs"][n].get("by_horizon", {}).items():
            if h.isdigit() and v.get("R@5") is not None:
                acc.setdefault(int(h), []).append(100 * v["R@5"])
    return {h: sum(v) / len(v) for h, v in acc.items()}


def _sig(report: dict, group: str) -> dict | None:
    names = set(groups(report).get(group, [group]))
    return next((s for s in report.get("significance", []) if s["run"] in names), None)


def headline_fusion(report: dict) -> str | None:
    """The LFTR fusion the report's checks and findings speak of: the one its significance tests use as their
    reference (the demo's fusion chosen on validation), else the fusion of the fewest spaces (the paper's headline is a
    two-space fusion), never whichever name sorts first."""
    fused = _find(report, "fusion")
    if not fused:
        return None
    refs = {s.get("reference") for s in report.get("significance", [])}
    tested = [f for f in fused if refs & set(groups(report).get(f, [f]))]
    return (tested or sorted(fused, key=lambda g: (g.count("+"), g)))[0]


def _range_check(report: dict, role: str, label: str, lo: float | None, hi: float | None) -> Check:
    names = _find(report, role)
    target = (f"<= {hi:g}" if lo is None else f"{lo:g}-{hi:g}" if hi is not None else f">= {lo:g}")
    if not names:
        return Check(label, target, "no run", None)
    v = _r5(report, names[0])
    ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    return Check(label, target, f"{_fmt_r5(report, names[0])} (`{names[0]}`)", ok)


def card_checks(card: dict) -> list[Check]:
    """The card's targets (`CARD_TARGETS`) and the reported GT precision."""
    values, out = card.get("values", {}), []
    for key, label, lo, hi in CARD_TARGETS:
        target = f"<= {hi:g}" if lo is None else f"{lo:g}-{hi:g}" if hi is not None else f">= {lo:g}"
        v = values.get(key)
        if v is None:
            out.append(Check(f"{label} (`{key}`)", target, "not on the card", None))
            continue
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
        out.append(Check(f"{label} (`{key}`)", target, _num(v), ok))
    prec = values.get("GT precision (main pool, measured)")
    out.append(Check("GT precision of the main pool (measured)", "reported (PSR: 0.894)",
                     "not reported" if prec is None else _num(prec), prec is not None))
    return out


def calibration(report: dict, card: dict | None = None, geometry: dict | None = None) -> list[Check]:
    """The calibration table of the synthetic benchmark (issue targets; see the README's synthetic section):
    the card's targets when ``card`` is given, then the report's, then (with ``geometry``, the spaces' geometry of
    `retrieval.complementarity`) whether each learned visual space is a space (`space_checks`)."""
    out = card_checks(card) if card is not None else []
    persistence = _range_check(report, "persistence", "persistence from frames R@5", 3, 15)
    present = ((card or {}).get("values") or {}).get("present_state_tie_ceiling_r5_pct")
    if present is not None and persistence.met is not None:
        persistence = replace(persistence, measured=persistence.measured + "; with the present's canonical state "
                              f"known (`eval card`: persistence with perfect perception) {present:.2f}")
    out += [_range_check(report, "random", "random R@5", None, 1),
            _range_check(report, "lookup", "lookup prior R@5", None, 15), persistence,
            _range_check(report, "independent", "independent-appearance oracle R@5", None, 15)]
    sem = _find(report, "semantic")
    if sem:
        v, hs = _r5(report, sem[0]), _by_h(report, sem[0])
        spread = max(abs(x - v) for x in hs.values()) if hs else float("nan")
        measured = f"{v:.1f}; h1-h5 " + " / ".join(f"{hs[h]:.0f}" for h in sorted(hs)) + f" (max dev {spread:.1f})"
        tie = tie_ceiling_by_horizon(card)
        if tie:
            measured += ("; the state-tie ceiling (`eval card`: the target state's segments tied first) h1-h5 "
                         + " / ".join(f"{tie[h][0]:.0f}" for h in sorted(tie)) + ", median segments of the target "
                         "state " + " / ".join(f"{tie[h][1]:.0f}" for h in sorted(tie)))
        out.append(Check("semantic-text oracle R@5", "40-85, every horizon within +-10 pp", measured,
                         40 <= v <= 85 and spread <= 10))
        para = _find(report, "paraphrase")
        if para:
            p = _r5(report, para[0])
            out.append(Check("paraphrase oracle (held-out phrasing) R@5", ">= 15 pp below the semantic-text oracle",
                             f"{p:.1f} ({v - p:.1f} pp below)", v - p >= 15))
        else:
            out.append(Check("paraphrase oracle (held-out phrasing) R@5", ">= 15 pp below the semantic-text oracle",
                             "no run", None))
    out += _ceiling_checks(report)
    out.append(_fusion_check(report))
    out.append(_decline_check(report))
    return out + (space_checks(report, geometry) if geometry else [])


def space_checks(report: dict, geometry: dict) -> list[Check]:
    """Each learned visual space of ``geometry`` (``{space: {kind, dim, effective_dim, ...}}``, every visual space
    but `REFERENCE_SPACE`): effective dimension >= `EFFECTIVE_SHARE` of its width, and its state-prototype oracle
    R@5 >= the reference space's (a collapsed space fails both)."""
    target = (f"effective dimension >= {100 * EFFECTIVE_SHARE:.0f}% of its width; state-prototype oracle >= "
              f"`oracle-state-prototype[{REFERENCE_SPACE}]`")
    groups_ = groups(report)

    def proto(space: str) -> str | None:
        name = f"oracle-state-prototype[{space}]"
        return name if name in groups_ else None

    ref = proto(REFERENCE_SPACE)
    out = []
    for space, g in geometry.items():
        if g.get("kind") != "visual" or space == REFERENCE_SPACE:
            continue
        eff, dim = float(g["effective_dim"]), int(g["dim"])
        parts, ok = [f"effective dimension {eff:.1f} of {dim} ({100 * eff / dim:.0f}%)"], eff >= EFFECTIVE_SHARE * dim
        parts += _text_tower_reach(space, g, geometry)
        mine = proto(space)
        if mine is None or ref is None:
            missing = [s for s, run in ((space, mine), (REFERENCE_SPACE, ref)) if run is None]
            parts.append("no state-prototype run of " + " or ".join(missing))
            ok = False if not ok else None  # too narrow is a miss whatever the oracle would say
        else:
            a, b = _r5(report, mine), _r5(report, ref)
            parts.append(f"state-prototype R@5 {a:.2f} vs {b:.2f} ({REFERENCE_SPACE})")
            ok = ok and a >= b
        out.append(Check(f"learned visual space `{space}` is a space", target, "; ".join(parts), ok))
    return out


def _text_tower_reach(space: str, g: dict, geometry: dict) -> list[str]:
    """For a visual space aligned to a locked text model (a LiT or CLIP space, its geometry's ``text_model``), what
    that text model itself spans: the effective dimension of a semantic space of the same model over the states. An
    image space that matched its text tower exactly would span about as much, so a width target above it is out of
    reach for that space whatever its training. Empty when no such semantic space was measured."""
    model = g.get("text_model")
    same = [(s, h) for s, h in geometry.items() if s != space and h.get("kind") == "semantic"
            and model and h.get("text_model") == model]
    if not same:
        return []
    sem, h = same[0]
    eff, dim = float(h["effective_dim"]), int(g["dim"])
    reach = "below" if eff < EFFECTIVE_SHARE * dim else "within"
    return [f"its locked text tower spans {eff:.1f} over the states (`{sem}`, {100 * eff / dim:.0f}% of {dim}): "
            f"matching it exactly keeps it {reach} the target"]


def _ceiling_checks(report: dict) -> list[Check]:
    """Perfect-perception LFTR against the oracle, and the best LFTR from frames (through a learned visual space or a
    supervised perceiver: both read only the prefix's frames) against perfect perception."""
    sem, perfect = _find(report, "semantic"), _find(report, "perfect")
    frames = _find(report, "lftr") + _find(report, "perceived")
    lo, hi = PERFECT_SHARE
    t1 = f"{100 * lo:.0f}%-{100 * hi:.0f}% of the semantic-text oracle"
    t2 = f">= {100 * FRAMES_SHARE:.0f}% of perfect-perception LFTR"
    if not (sem and perfect):
        return [Check("perfect-perception LFTR R@5", t1, "no run", None),
                Check("best single LFTR from frames R@5", t2, "no run", None)]
    o, p = _r5(report, sem[0]), _r5(report, perfect[0])
    out = [Check("perfect-perception LFTR R@5", t1, f"{_fmt_r5(report, perfect[0])} = {100 * p / o:.0f}% of "
                 f"{o:.1f} (`{perfect[0]}`)", lo <= p / o <= hi)]
    if frames:
        best = max(frames, key=lambda g: _r5(report, g))
        f = _r5(report, best)
        out.append(Check("best single LFTR from frames R@5", t2, f"{_fmt_r5(report, best)} (`{best}`) = "
                         f"{100 * f / p:.0f}% of {p:.1f}", p > 0 and f / p >= FRAMES_SHARE))
    else:
        out.append(Check("best single LFTR from frames R@5", t2, "no run", None))
    return out


def _fusion_check(report: dict) -> Check:
    """Each fusion from frames (the headline fusion, `headline_fusion`, and the fusion through the perceiver) against
    the best single LFTR from frames of either route: met when one is above it with both tests' p < `SIG_LEVEL`. The
    test that decides is the one of the seed means (`eval.report`'s ``--pair GROUP:GROUP``) where the report holds
    it, else a test of single runs; every test found is shown."""
    target = "above the best single space (bootstrap and McNemar p < 0.01)"
    singles = _find(report, "lftr") + _find(report, "perceived")
    fusions = [f for f in (headline_fusion(report), *_find(report, "perceived-fusion")) if f]
    if not fusions or not singles:
        return Check("LFTR fusion R@5", target, "no run", None)
    best = max(singles, key=lambda g: _r5(report, g))
    texts, met = [], False
    for f in fusions:
        d = _r5(report, f) - _r5(report, best)
        parts, tests = [f"{_fmt_r5(report, f)} (`{f}`); vs best single `{best}` {d:+.2f} pp"], _tests(report, f, best)
        parts += [f"{label}: bootstrap p {_p(pb)}, McNemar p {_p(pm)}" + (f", paired t over seeds p {_p(pt)}"
                                                                           if pt is not None else "")
                  for label, pb, pm, pt in tests] or ["no test against the fusion"]
        if tests:
            pb, pm = tests[0][1:3]
            met |= d > 0 and pb is not None and pm is not None and pb < SIG_LEVEL and pm < SIG_LEVEL
        texts.append("; ".join(parts))
    return Check("LFTR fusion R@5", target, " | ".join(texts), met)


def _tests(report: dict, fusion: str, single: str) -> list[tuple[str, float | None, float | None, float | None]]:
    """The report's per-query tests between ``fusion`` and ``single`` (either way round, by group or by run):
    ``(label, bootstrap p, McNemar p, paired t over seeds p or None)``, the test of the seed means first."""
    from eval.runs import seed_group

    gf, gs = set(groups(report).get(fusion, [fusion])), set(groups(report).get(single, [single]))
    found = []
    for t in [*report.get("pairs", []), *report.get("significance", [])]:
        ends = {t.get("run"), t.get("reference")}
        if "bootstrap" not in t or not (ends & (gf | {fusion}) and ends & (gs | {single})):
            continue
        if seed_group(str(t.get("run")))[1] != seed_group(str(t.get("reference")))[1]:
            continue  # one seed's head against another seed's fusion: no comparison the table makes
        seeds = t.get("seeds") or []
        label = ("seed mean (seeds " + ", ".join(map(str, seeds)) + ")") if seeds else \
            f"`{t['run']}` vs `{t['reference']}`"
        found.append((not seeds, label, t["bootstrap"].get("p_value"), t["mcnemar"].get("p_value"),
                      (t.get("ttest") or {}).get("p_value")))
    return [tuple(rest) for _, *rest in sorted(found, key=lambda x: x[0])]


def _p(p) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def _pooled_far(report: dict, group: str) -> tuple[float, int] | None:
    """R@5 x100 of the h >= 3 queries pooled (each horizon's R@5 weighted by its n; the group's mean) and their
    number."""
    vals, n_out = [], 0
    for name in groups(report)[group]:
        far = [(v["R@5"], v["n"]) for h, v in report["runs"][name].get("by_horizon", {}).items()
               if h.isdigit() and int(h) >= 3 and v.get("R@5") is not None and v.get("n")]
        n = sum(k for _, k in far)
        if n:
            vals.append(100 * sum(r * k for r, k in far) / n)
            n_out = n
    return (sum(vals) / len(vals), n_out) if vals else None


def _decline_check(report: dict) -> Check:
    """h1 against the h >= 3 queries as one bucket (single far horizons hold a few dozen queries each: their
    R@5 is shown, not judged)."""
    target = "decline from h1 to h3+ (h >= 3 pooled)"
    names = (_find(report, "lftr") + _find(report, "perceived") + _find(report, "perfect") + _find(report, "fusion")
             + _find(report, "perceived-fusion"))
    if not names:
        return Check("learned heads over horizons", target, "no run", None)
    parts, ok = [], True
    for n in names:
        hs, far = _by_h(report, n), _pooled_far(report, n)
        if 1 not in hs or far is None:
            continue
        ok &= hs[1] - far[0] > 0
        each = " / ".join(f"{hs[h]:.1f}" for h in sorted(hs) if h >= 3)
        parts.append(f"`{n}` h1 {hs[1]:.1f} -> h3+ {far[0]:.1f} (n {far[1]}; h3.. {each})")
    return Check("learned heads over horizons", target, "; ".join(parts) or "no horizon data",
                 ok if parts else None)


def tie_ceiling_by_horizon(card: dict | None) -> dict[int, tuple[float, float]]:
    """The card's state-tie ceiling by horizon (`eval.card.state_tie_ceiling`): horizon -> (R@5 x100, median
    segments of the target state); empty when the card has none."""
    by_h = ((card or {}).get("state_tie_ceiling") or {}).get("by_horizon") or {}
    return {int(h): (float(v["r5_pct"]), float(v["state_segments_median"])) for h, v in by_h.items()}


def ceiling(report: dict, predictability: dict | None = None, card: dict | None = None
            ) -> list[tuple[str, str, float]]:
    """The ceiling decomposition (R@5 x100, seeds' means): the semantic-text oracle (what the labels allow), the
    perfect-perception LFTR (what forecasting allows) and, where it ran, the state classifier from the same exact state
    (`retrieval.classifier`: whether another learner forecasts better from it), the transition table (the present as
    a label), the best LFTR from frames and the fusion (perception + forecasting) -- as (stage, run, value) rows, in
    that order.

    ``predictability`` (the JSON of `python -m eval predictability`) adds, after the oracle, what foresight reaches:
    the future true state named by its usual label (no perturbation), then the same under each perturbation at the
    prefix's end (the world's own uncertainty; `eval.synth.predictability`). ``card`` (`eval card`'s JSON) adds,
    first, the state-tie ceiling: what knowing the target's canonical state allows when the main pool is a budgeted
    subset of that state's segments (`eval.card.state_tie_ceiling`; the semantic-text oracle reaches it exactly
    when every positive carries the target state); and after the transition table, the same tie of the query's
    current state (`eval.card.present_tie_ceiling`: persistence with perfect perception)."""
    rows = []
    for stage, role in (("labels: semantic-text oracle", "semantic"), ("forecasting: perfect-perception LFTR",
                                                                        "perfect"),
                        ("forecasting: a state classifier from the same exact state (not the paper's method)",
                         "classifier"),
                        ("the present as a label: transition table", "transition"),
                        ("perception + forecasting: best LFTR from frames", "lftr"),
                        ("perception + forecasting: LFTR from frames through a supervised perceiver (not the paper's "
                         "method)", "perceived"),
                        ("perception + forecasting: LFTR fusion", "fusion"),
                        ("perception + forecasting: LFTR fusion through the supervised perceiver (not the paper's "
                         "method)", "perceived-fusion")):
        names = _find(report, role)
        if names:
            best = (max(names, key=lambda g: _r5(report, g)) if role in ("lftr", "perceived")
                    else headline_fusion(report) if role == "fusion" else names[0])
            rows.append((stage, best, _r5(report, best)))
    if predictability and rows and rows[0][1] in _find(report, "semantic"):
        rows[1:1] = _foresight_rows(predictability)
    values = (card or {}).get("values", {})
    tie, present = values.get("state_tie_ceiling_r5_pct"), values.get("present_state_tie_ceiling_r5_pct")
    if tie is not None and rows and rows[0][1] in _find(report, "semantic"):
        rows.insert(0, ("labels: the target's canonical state known, its segments tied first", "eval card",
                        float(tie)))
        if present is not None:
            at = next((i + 1 for i, r in enumerate(rows) if r[1] in _find(report, "transition")), len(rows))
            rows.insert(at, ("the present as a label: its state's segments tied first (persistence with perfect "
                             "perception)", "eval card", float(present)))
    return rows


def _foresight_rows(predictability: dict) -> list[tuple[str, str, float]]:
    out = []
    for lv in predictability.get("levels", []):
        if lv["pos_sd"] == 0 and lv["vel_sd"] == 0:
            stage = "labels: the future true state foreseen, named by its usual label"
        else:
            stage = (f"the world: foresight up to a perturbation of {lv['pos_sd']:g} units and {100 * lv['vel_sd']:g}% "
                     f"velocity at the prefix's end ({100 * lv['kept']:.0f}% of answers kept)")
        out.append((stage, f"eval predictability {lv['perturbation']}", float(lv["ceiling_r5"])))
    return out


def ceiling_markdown(report: dict, predictability: dict | None = None, card: dict | None = None) -> str:
    rows = ceiling(report, predictability, card)
    if not rows:
        return ""
    sem = _find(report, "semantic")
    top = next((v for _, run, v in rows if sem and run == sem[0]), rows[0][2]) or float("nan")
    lines = ["| stage | run | R@5 | share of the oracle |", "|---|---|---:|---:|"]
    lines += [f"| {st} | `{run}` | {v:.2f} | {100 * v / top:.0f}% |" for st, run, v in rows]
    return "\n".join(lines) + "\n"


def calibration_markdown(checks: list[Check]) -> str:
    lines = ["| quantity | target | measured | verdict |", "|---|---|---|---|", *(c.line() for c in checks)]
    return "\n".join(lines) + "\n"


def card_beside_paper(card: dict) -> str:
    """The card's rows that the paper reports, side by side, and the build fingerprint line
    (`eval.card.fingerprint_line`)."""
    from eval.fingerprint import fingerprint_line

    rows = ["| quantity | this benchmark | PSR (paper) |", "|---|---:|---:|"]
    for k, p in card.get("paper", {}).items():
        v = card["values"].get(k)
        rows.append(f"| {k} | {_num(v)} | {_num(p)} |")
    line = fingerprint_line(card)
    return "\n".join(rows) + "\n" + (f"\n{line}\n" if line else "")


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def load(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _pair_r5(report: dict, t: dict, name: str) -> float:
    """R@5 x100 of one side of a ``--pair`` test: a run's, or a seed group's mean over the test's seeds."""
    if name in report["runs"]:
        return 100 * report["runs"][name]["main"]["R@5"]
    from eval.runs import seed_group

    vals = [v["main"]["R@5"] for n, v in report["runs"].items()
            if seed_group(n)[0] == name and seed_group(n)[1] in t.get("seeds", [])]
    return 100 * sum(vals) / len(vals)


def _pair_line(report: dict, t: dict) -> str:
    """One ``--pair`` test of the report as a finding: does ``run`` beat ``reference`` significantly?"""
    a, b = t["run"], t["reference"]
    boot, mc = t["bootstrap"], t["mcnemar"]
    pb, pm = boot["p_value"], mc["p_value"]
    sig = boot["delta"] > 0 and pb is not None and pm is not None and pb < SIG_LEVEL and pm < SIG_LEVEL
    verdict = f"beats `{b}` significantly" if sig else f"does not beat `{b}` significantly"
    seeds = t.get("seeds") or []
    on = f"; each query's hit averaged over seeds {', '.join(map(str, seeds))}" if seeds else ""
    if t.get("ttest"):
        on += f"; paired t over those seeds p = {_p(t['ttest']['p_value'])}"
    return (f"- `{a}` {verdict} (p < {SIG_LEVEL:g}): R@5 {_pair_r5(report, t, a):.1f} vs {_pair_r5(report, t, b):.1f} "
            f"(paired bootstrap Δ {100 * boot['delta']:+.1f} pp, 95% CI [{100 * boot['ci_low']:+.1f}, "
            f"{100 * boot['ci_high']:+.1f}], p = {_p(pb)}; McNemar p = {_p(pm)}; n = {t['n']}{on}).")


def findings(report: dict, card: dict | None = None) -> list[str]:
    """The headline comparisons of a report, as Markdown bullets: fusion against the better single space (with its
    significance), each learned method's R@5 by horizon, every ``--pair`` test (e.g. a learned visual space against
    pixels), a text -> image space's zero-shot oracle, the oracle ceiling against the best predictor. With ``card``
    (`eval card`'s JSON): perfect-perception LFTR, the best single LFTR and the headline fusion by horizon as shares of
    the state-tie ceiling of each horizon (`tie_ceiling_by_horizon`), which the labels set apart from forecasting."""
    runs = report["runs"]
    lines = []
    fused, singles = _find(report, "fusion"), _find(report, "lftr")
    if fused and singles:
        f, best = headline_fusion(report), max(singles, key=lambda g: _r5(report, g))
        verdict = "beats" if _r5(report, f) > _r5(report, best) else "does not beat"
        line = (f"- z-score fusion `{f}` {verdict} the better single space `{best}`: R@5 {_fmt_r5(report, f)} vs "
                f"{_fmt_r5(report, best)}")
        s = _sig(report, best)
        if s and s.get("reference") in groups(report).get(f, [f]):
            b = s["bootstrap"]
            line += (f" (paired bootstrap Δ {-100 * b['delta']:+.1f} pp, 95% CI [{-100 * b['ci_high']:+.1f}, "
                     f"{-100 * b['ci_low']:+.1f}], p = {_p(b['p_value'])}; McNemar p = {_p(s['mcnemar']['p_value'])})")
        lines.append(line + ".")
    more = _find(report, "perceived-fusion") + _find(report, "perfect")
    for n in fused + more + singles + _find(report, "perceived"):
        hs = _by_h(report, n)
        if hs:
            curve = " → ".join(f"h{h} {v:.1f}" for h, v in sorted(hs.items()))
            lines.append(f"- `{n}` R@5 by horizon: {curve}.")
    tie = tie_ceiling_by_horizon(card)
    if tie:
        heads = _find(report, "perfect")[:1] + ([max(singles, key=lambda g: _r5(report, g))] if singles else [])
        heads += ([headline_fusion(report)] if fused else []) + _find(report, "perceived-fusion")
        for n in heads:
            hs = _by_h(report, n)
            shares = [f"h{h} {100 * v / tie[h][0]:.0f}%" for h, v in sorted(hs.items()) if tie.get(h, (0,))[0] > 0]
            if shares:
                lines.append(f"- `{n}` R@5 as a share of the state-tie ceiling of each horizon: " + " → ".join(shares)
                             + ".")
    known = set(runs) | set(groups(report))
    lines += [_pair_line(report, t) for t in report.get("pairs", []) if t["run"] in known and t["reference"] in known]
    sem = _find(report, "semantic")
    for n in sem[1:]:  # a text -> image space's semantic-text oracle: its zero-shot text -> image retrieval
        lines.append(f"- Zero-shot text → image retrieval `{n}` (the true state text embedded by the space's text "
                     f"tower ranks frames directly): R@5 {_r5(report, n):.1f}, against `{sem[0]}` "
                     f"{_r5(report, sem[0]):.1f}.")
    if sem:
        hs = _by_h(report, sem[0])
        oracles = ROLES["semantic"] + ROLES["paraphrase"] + ROLES["independent"] + ("state-prototype",
                                                                                     "oracle-state-prototype")
        perfect = ROLES["perfect"] + ROLES["classifier"] + ROLES["transition"]
        predictors = [n for n in groups(report) if not n.startswith(oracles + perfect)]
        if predictors and hs:
            best = max(predictors, key=lambda g: _r5(report, g))
            lines.append(f"- The semantic-text oracle reaches {_r5(report, sem[0]):.1f} R@5 ({min(hs.values()):.0f}–"
                         f"{max(hs.values()):.0f} over horizons); the best predictor from frames (`{best}`) reaches "
                         f"{_fmt_r5(report, best)}.")
    return lines
