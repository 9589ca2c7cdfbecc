"""Findings computed from a report (and a benchmark card): what the numbers say, never typed in by hand.

`calibration` checks a synthetic benchmark's difficulty against the targets that make it PSR-shaped (each a line:
quantity, target, measured, met or not); `findings` states the headline comparisons of a demo report (fusion against
the best single space, each learned method's decline over horizons, the oracle ceiling). Both read only
``report.json`` (`eval.report`) and ``card.json`` (`eval.card`); ``python -m eval findings REPORT_DIR [--card ...]``
prints them. Runs are recognised by their names' prefixes (`ROLES`), as `retrieval demo` names them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Run-name prefixes of the roles the checks need (first match wins).
ROLES = {
    "random": ("random",), "lookup": ("lookup",), "persistence": ("persistence",),
    "independent": ("independent-appearance", "oracle-independent-appearance"),
    "semantic": ("semantic-text", "oracle-semantic-text"), "paraphrase": ("paraphrase", "oracle-paraphrase"),
    "fusion": ("lftr-fusion",), "lftr": ("lftr[",),
}
SIG_LEVEL = 0.01


@dataclass(frozen=True)
class Check:
    quantity: str
    target: str
    measured: str
    met: bool | None  # None: not measurable from this report

    def line(self) -> str:
        mark = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"| {self.quantity} | {self.target} | {self.measured} | {mark} |"


def _find(runs: dict, role: str) -> list[str]:
    prefixes = ROLES[role]
    return [n for n in runs if n.startswith(prefixes)]


def _r5(runs: dict, name: str) -> float:
    return 100 * runs[name]["main"]["R@5"]


def _by_h(runs: dict, name: str) -> dict[int, float]:
    return {int(h): 100 * v["R@5"] for h, v in runs[name].get("by_horizon", {}).items()
            if h.isdigit() and v.get("R@5") is not None}


def _sig(report: dict, run: str) -> dict | None:
    return next((s for s in report.get("significance", []) if s["run"] == run), None)


def _range_check(runs: dict, role: str, label: str, lo: float | None, hi: float | None) -> Check:
    names = _find(runs, role)
    target = (f"<= {hi:g}" if lo is None else f"{lo:g}-{hi:g}" if hi is not None else f">= {lo:g}")
    if not names:
        return Check(label, target, "no run", None)
    v = _r5(runs, names[0])
    ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    return Check(label, target, f"{v:.2f} (`{names[0]}`)", ok)


def calibration(report: dict) -> list[Check]:
    """The calibration table of the synthetic benchmark (issue targets; see the README's synthetic section)."""
    runs = report["runs"]
    out = [_range_check(runs, "random", "random R@5", None, 1),
           _range_check(runs, "lookup", "lookup prior R@5", None, 15),
           _range_check(runs, "persistence", "persistence R@5", 3, 15),
           _range_check(runs, "independent", "independent-appearance oracle R@5", None, 15)]
    sem = _find(runs, "semantic")
    if sem:
        v, hs = _r5(runs, sem[0]), _by_h(runs, sem[0])
        spread = max(abs(x - v) for x in hs.values()) if hs else float("nan")
        out.append(Check("semantic-text oracle R@5", "40-85, every horizon within +-10 pp",
                         f"{v:.1f}; h1-h5 " + " / ".join(f"{hs[h]:.0f}" for h in sorted(hs)) + f" (max dev {spread:.1f})",
                         40 <= v <= 85 and spread <= 10))
        para = _find(runs, "paraphrase")
        if para:
            p = _r5(runs, para[0])
            out.append(Check("paraphrase oracle (held-out phrasing) R@5", ">= 15 pp below the semantic-text oracle",
                             f"{p:.1f} ({v - p:.1f} pp below)", v - p >= 15))
        else:
            out.append(Check("paraphrase oracle (held-out phrasing) R@5", ">= 15 pp below the semantic-text oracle",
                             "no run", None))
    out.append(_fusion_check(report))
    out.append(_decline_check(runs))
    return out


def _fusion_check(report: dict) -> Check:
    runs = report["runs"]
    target = "above lookup and persistence (bootstrap and McNemar p < 0.01) and above the best single space"
    fused, singles = _find(runs, "fusion"), _find(runs, "lftr")
    if not fused:
        return Check("LFTR fusion R@5", target, "no run", None)
    f = fused[0]
    parts, ok = [f"{_r5(runs, f):.2f}"], True
    for role in ("lookup", "persistence"):
        for n in _find(runs, role)[:1]:
            s = _sig(report, n)
            if s is None or s.get("reference") != f:
                parts.append(f"vs {n}: no test against the fusion")
                ok = False
                continue
            pb, pm = s["bootstrap"]["p_value"], s["mcnemar"]["p_value"]
            delta = -100 * s["bootstrap"]["delta"]
            good = delta > 0 and pb is not None and pm is not None and pb < SIG_LEVEL and pm < SIG_LEVEL
            ok &= good
            parts.append(f"vs {n} {delta:+.2f} pp (bootstrap p {_p(pb)}, McNemar p {_p(pm)})")
    if singles:
        best = max(singles, key=lambda n: _r5(runs, n))
        d = _r5(runs, f) - _r5(runs, best)
        ok &= d > 0
        parts.append(f"vs best single `{best}` {d:+.2f} pp")
    return Check("LFTR fusion R@5", target, "; ".join(parts), ok)


def _p(p) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def _pooled_far(runs: dict, name: str) -> tuple[float, int] | None:
    """R@5 x100 of the h >= 3 queries pooled (each horizon's R@5 weighted by its n) and their number."""
    far = [(v["R@5"], v["n"]) for h, v in runs[name].get("by_horizon", {}).items()
           if h.isdigit() and int(h) >= 3 and v.get("R@5") is not None and v.get("n")]
    n = sum(k for _, k in far)
    return (100 * sum(r * k for r, k in far) / n, n) if n else None


def _decline_check(runs: dict) -> Check:
    """h1 against the h >= 3 queries as one bucket (single far horizons hold a few dozen queries each: their
    R@5 is shown, not judged)."""
    target = "decline from h1 to h3+ (h >= 3 pooled)"
    names = _find(runs, "lftr") + _find(runs, "fusion")
    if not names:
        return Check("learned heads over horizons", target, "no run", None)
    parts, ok = [], True
    for n in names:
        hs, far = _by_h(runs, n), _pooled_far(runs, n)
        if 1 not in hs or far is None:
            continue
        ok &= hs[1] - far[0] > 0
        each = " / ".join(f"{hs[h]:.1f}" for h in sorted(hs) if h >= 3)
        parts.append(f"`{n}` h1 {hs[1]:.1f} -> h3+ {far[0]:.1f} (n {far[1]}; h3.. {each})")
    return Check("learned heads over horizons", target, "; ".join(parts) or "no horizon data",
                 ok if parts else None)


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


def _pair_line(runs: dict, t: dict) -> str:
    """One ``--pair`` test of the report as a finding: does ``run`` beat ``reference`` significantly?"""
    a, b = t["run"], t["reference"]
    boot, mc = t["bootstrap"], t["mcnemar"]
    pb, pm = boot["p_value"], mc["p_value"]
    sig = boot["delta"] > 0 and pb is not None and pm is not None and pb < SIG_LEVEL and pm < SIG_LEVEL
    verdict = f"beats `{b}` significantly" if sig else f"does not beat `{b}` significantly"
    return (f"- `{a}` {verdict} (p < {SIG_LEVEL:g}): R@5 {_r5(runs, a):.1f} vs {_r5(runs, b):.1f} (paired bootstrap "
            f"Δ {100 * boot['delta']:+.1f} pp, 95% CI [{100 * boot['ci_low']:+.1f}, {100 * boot['ci_high']:+.1f}], "
            f"p = {_p(pb)}; McNemar p = {_p(pm)}; n = {t['n']}).")


def findings(report: dict) -> list[str]:
    """The headline comparisons of a report, as Markdown bullets: fusion against the better single space (with its
    significance), each learned method's R@5 by horizon, every ``--pair`` test (e.g. a learned visual space against
    pixels), a text -> image space's zero-shot oracle, the oracle ceiling against the best predictor."""
    runs = report["runs"]
    lines = []
    fused, singles = _find(runs, "fusion"), _find(runs, "lftr")
    if fused and singles:
        f, best = fused[0], max(singles, key=lambda n: _r5(runs, n))
        verdict = "beats" if _r5(runs, f) > _r5(runs, best) else "does not beat"
        line = f"- z-score fusion `{f}` {verdict} the better single space `{best}`: R@5 {_r5(runs, f):.1f} vs {_r5(runs, best):.1f}"
        s = _sig(report, best)
        if s and s.get("reference") == f:
            b = s["bootstrap"]
            line += (f" (paired bootstrap Δ {-100 * b['delta']:+.1f} pp, 95% CI [{-100 * b['ci_high']:+.1f}, "
                     f"{-100 * b['ci_low']:+.1f}], p = {_p(b['p_value'])}; McNemar p = {_p(s['mcnemar']['p_value'])})")
        lines.append(line + ".")
    for n in fused + singles:
        hs = _by_h(runs, n)
        if hs:
            curve = " → ".join(f"h{h} {v:.1f}" for h, v in sorted(hs.items()))
            lines.append(f"- `{n}` R@5 by horizon: {curve}.")
    lines += [_pair_line(runs, t) for t in report.get("pairs", []) if t["run"] in runs and t["reference"] in runs]
    sem = _find(runs, "semantic")
    for n in sem[1:]:  # a text -> image space's semantic-text oracle: its zero-shot text -> image retrieval
        lines.append(f"- Zero-shot text → image retrieval `{n}` (the true state text embedded by the space's text "
                     f"tower ranks frames directly): R@5 {_r5(runs, n):.1f}, against `{sem[0]}` {_r5(runs, sem[0]):.1f}.")
    if sem:
        hs = _by_h(runs, sem[0])
        oracles = ROLES["semantic"] + ROLES["paraphrase"] + ROLES["independent"] + ("state-prototype",
                                                                                     "oracle-state-prototype")
        predictors = [n for n in runs if not n.startswith(oracles)]
        if predictors and hs:
            best = max(predictors, key=lambda n: _r5(runs, n))
            lines.append(f"- The semantic-text oracle reaches {_r5(runs, sem[0]):.1f} R@5 ({min(hs.values()):.0f}–"
                         f"{max(hs.values()):.0f} over horizons); the best predictor (`{best}`) reaches "
                         f"{_r5(runs, best):.1f}.")
    return lines
