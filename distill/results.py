"""The distillation section of the results page (``docs/results.md``), generated from a recipe's outputs.

`section(out)` reads what ``python -m distill recipe`` wrote under ``out`` (``recipe.json``, ``predicates.jsonl``
and its config, ``study/study.json``, ``leaks/leaks.json``, the tiny student's record) and returns Markdown lines:
the setup and the state of the synthetic world's prefixes, the three students at each budget with their CIs and
paired differences, faithfulness against its floors, the targets (the better student against twice the majority
class), the validator's catch rates on injected and held-out leaks, and the seconds each stage took. Nothing is
typed in: every number comes from those files. ``make demo`` (`scripts/demo.py`) appends it to the results page;
the recipe writes it to ``out/results.md``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def world_note(out: Path, split_ids: set[str] | None = None) -> str | None:
    """How often the queried object moves at the end of the prefix, from the predicate sets' ``direction`` facts."""
    path = out / "predicates.jsonl"
    if not path.is_file():
        return None
    dirs: Counter = Counter()
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if split_ids is not None and d["query_id"] not in split_ids:
                continue
            n += 1
            v = next((x.get("value") for x in d["facts"] if x["kind"] == "direction"), None)
            held = any(x["kind"] == "support_now" and x.get("value") == "gripper" for x in d["facts"])
            dirs["held by the gripper" if v is None and held else v or "no record"] += 1
    if not n:
        return None
    moving = n - dirs.get("still", 0) - dirs.get("held by the gripper", 0) - dirs.get("no record", 0)
    return (f"At the end of the prefix the queried object moves in {moving} of {n} predicate sets "
            f"(direction predicate: not moving {dirs.get('still', 0)}, held by the gripper "
            f"{dirs.get('held by the gripper', 0)}). Where nothing moves, the evidence holds no motion to reason from; "
            "rerun on a build whose prefixes show motion to ask what reasoning adds.")


def targets(study: dict[str, Any]) -> list[str]:
    """The issue's targets, measured: the better student against twice the majority class; CoT - answer-only and
    CoT - trajectory-labels with their video-clustered CIs (each budget)."""
    best = None
    for name, b in study["budgets"].items():
        for s in b["students"].values():
            if s["exact"]["value"] is not None and (best is None or s["exact"]["value"] > best[2]["value"]):
                best = (name, s["name"], s["exact"])
    lines = []
    if best:
        maj = next(iter(study["budgets"].values()))["majority"]["exact"]["value"]
        met = best[2]["value"] >= 2 * maj
        lines.append(f"- Better student: {best[1]} at {best[0]}, exact {100 * best[2]['value']:.1f}% "
                     f"[{100 * best[2]['ci_low']:.1f}, {100 * best[2]['ci_high']:.1f}] against the majority class "
                     f"{100 * maj:.1f}% (target: at least {200 * maj:.1f}%): {'met' if met else 'not met'}.")
    for name, b in study["budgets"].items():
        ds = [p for p in b["pairs"] if p["a"] == "cot" and p["read"] == "exact"]
        if ds:
            from distill.study import VARIANT_NAMES, delta

            lines.append(f"- {name}: " + "; ".join(f"CoT − {VARIANT_NAMES[p['b']]} {delta(p)} points" for p in ds)
                         + " (exact, paired bootstrap over videos).")
    return lines


def stage_seconds(out: Path) -> list[str]:
    """A table of each recipe stage's seconds (``recipe.json``) and their sum."""
    rec = _read(out / "recipe.json") or {}
    stages = rec.get("stages") or {}
    if not stages:
        return []
    def cpu(s):
        return "–" if s.get("cpu_seconds") is None else f"{s['cpu_seconds']:.0f}"

    def wall(s):
        return "–" if s.get("seconds") is None else f"{s['seconds']:.0f}"

    rows = [f"| {name} | {wall(s)} | {cpu(s)} |" for name, s in stages.items()]
    total = sum(s.get("seconds") or 0 for s in stages.values())
    total_cpu = sum(s.get("cpu_seconds") or 0 for s in stages.values())
    last = rec.get("last_run") or {}
    whole = ([f"| **the recipe's last run** ({len(last.get('stages', []))} stages, {last.get('jobs', 1)} at a time) | "
              f"**{last['seconds']:.0f}** | |"] if last.get("seconds") else [])
    return ["| stage | wall s | CPU s |", "|---|---:|---:|", *rows,
            f"| **sum of the stages** | **{total:.0f}** | **{total_cpu:.0f}** |", *whole,
            "", "Wall seconds are those of the machine the recipe ran on (shared or not); CPU seconds are the stage's "
            "processes' user + system time, every thread counted. Stages side by side (`--jobs`) overlap, so the "
            "last run's wall time can be below their sum."]


def section(out: str | Path) -> list[str]:
    """The distillation section (module docstring); empty when ``out`` holds no study."""
    from distill.leaks import to_markdown as leaks_markdown
    from distill.study import to_markdown as study_markdown

    out = Path(out)
    study = _read(out / "study" / "study.json")
    if study is None:
        return []
    rec = (_read(out / "recipe.json") or {}).get("config", {})
    tiny = _read(out / "tiny-student" / "psr_tiny_student.json")
    lines = ["## Distillation: three students at equal budget, on CPU (`python -m distill recipe`)", "",
             f"Generated from `{out.name}/` by the recipe (`python -m distill recipe --cpu-demo --config "
             f"{Path(rec.get('config') or '?').name}`, `make demo`'s distill stage); student input "
             f"`{rec.get('student_input', '?')}`, closed slice of the K = {study['k']} most frequent train targets. "
             "Each student is trained at each budget with every seed, answers every test query of the slice "
             "greedily, and is scored by `python -m distill study`."]
    if tiny:
        lines[-1] += (f" Student: a config-built Qwen3 causal LM of {tiny['parameters']:,} parameters "
                      f"(vocabulary {tiny['vocab']}, fully fine-tuned).")
    note = world_note(out, _test_ids(out, rec))
    if note:
        lines += ["", note]
    lines += ["", study_markdown(study), "Targets:", "", *targets(study), ""]
    leaks = _read(out / "leaks" / "leaks.json")
    if leaks:
        leaks = {k: v for k, v in leaks.items() if k != "sweep"}
        lines += ["### The validator on injected and held-out leaks (`python -m distill leaks`)", "",
                  leaks_markdown(leaks), f"({leaks.get('wall_s', 0):.0f} s)", ""]
    secs = stage_seconds(out)
    if secs:
        lines += ["### Seconds per stage (`recipe.json`)", "", *secs, ""]
    return lines


def _test_ids(out: Path, rec: dict) -> set[str] | None:
    """The benchmark's test query ids (None when the benchmark is not at hand)."""
    data = rec.get("data")
    if not data or not (Path(data) / "queries.jsonl").is_file():
        return None
    ids = set()
    with open(Path(data) / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d.get("split") == "test":
                ids.add(d["id"])
    return ids
