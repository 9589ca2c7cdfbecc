"""Answer accuracy of phrase files (DynaPix's selection accuracy, in PSR's open-vocabulary form), with paired tests.

A query is answered correctly when its parsed phrase, cleaned as the student parser cleans it, equals one of the
phrasings of the target canonical state (``states.jsonl`` members); an unparsed or unknown phrase is a miss. Methods
are compared on the queries every phrase file answers (the intersection), with McNemar's exact test and a paired
bootstrap of the accuracy difference against a reference method (`eval.stats`). This complements the retrieval
report (``python -m eval report``), which scores the same phrases through a retrieval space.

``python -m distill answers --data DIR --phrases '[a.jsonl, b.jsonl]' --names '[zero-shot, cot]' --reference zero-shot
--out DIR`` writes ``answers.json`` and ``answers.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class AnswersConfig:
    """``python -m distill answers``: answer accuracy of phrase files and paired significance."""

    data: str = field(metadata={"help": "benchmark directory"})
    phrases: list[str] = field(metadata={"help": "phrase files (JSONL) to compare"})
    out: str = field(metadata={"help": "output directory"})
    names: list[str] | None = field(default=None, metadata={"help": "method names (default: file stems)"})
    reference: str | None = field(default=None, metadata={"help": "method to test every other against"})
    resamples: int = field(default=10_000, metadata={"help": "paired bootstrap resamples"})
    seed: int = field(default=0, metadata={"help": "bootstrap seed"})


def hits(bench, records: dict, query_ids: list[str], lookup: dict[str, str]) -> np.ndarray:
    """(n,) float64 0/1: the phrase of each query names its target state."""
    from distill.faithfulness import canonical

    targets = {q.id: q.target_state for q in bench.queries()}
    return np.asarray([float(records[q].ok and canonical(records[q].phrase, lookup) == targets[q]) for q in query_ids])


def compare_answers(cfg: AnswersConfig) -> dict[str, Any]:
    from distill.faithfulness import phrase_lookup
    from distill.predicates import OracleIndex
    from eval.benchmark import Benchmark
    from eval.io import write_json
    from eval.phrases import read_phrases
    from eval.stats import mcnemar_exact, paired_bootstrap

    names = cfg.names or [Path(p).name.removesuffix(".jsonl") for p in cfg.phrases]
    if len(names) != len(cfg.phrases) or len(set(names)) != len(names):
        raise ValueError(f"need one distinct name per phrase file, got {names} for {len(cfg.phrases)} file(s)")
    if cfg.reference is not None and cfg.reference not in names:
        raise ValueError(f"reference {cfg.reference!r} is not one of {names}")
    bench = Benchmark.load(cfg.data)
    lookup = phrase_lookup(OracleIndex(bench, use_sim=False).members)
    recs = {n: read_phrases(p) for n, p in zip(names, cfg.phrases, strict=True)}
    common = sorted(set.intersection(*(set(r) for r in recs.values())) & set(bench.query_index))
    if not common:
        raise ValueError("the phrase files share no query of the benchmark")
    qtype = {q.id: q.qtype for q in bench.queries()}
    qt = np.asarray([qtype[q] for q in common])
    h = {n: hits(bench, recs[n], common, lookup) for n in names}
    methods = {}
    for n in names:
        parsed = float(np.mean([recs[n][q].ok for q in common]))
        methods[n] = {"n": len(common), "parse_rate": round(parsed, 4), "accuracy": round(float(h[n].mean()), 4),
                      "by_qtype": {t: round(float(h[n][qt == t].mean()), 4) for t in sorted(set(qt))}}
        if cfg.reference is not None and n != cfg.reference:
            mc = mcnemar_exact(h[n], h[cfg.reference])
            bs = paired_bootstrap(h[n], h[cfg.reference], n_resamples=cfg.resamples, seed=cfg.seed)
            methods[n]["vs_reference"] = {"mcnemar": mc.to_dict(), "bootstrap": bs.to_dict()}
    result = {"reference": cfg.reference, "n_common": len(common), "methods": methods}
    out = Path(cfg.out)
    write_json(out / "answers.json", result)
    (out / "answers.md").write_text(to_markdown(result), encoding="utf-8")
    return result


def to_markdown(result: dict[str, Any]) -> str:
    ref = result["reference"]
    qtypes = sorted({t for m in result["methods"].values() for t in m["by_qtype"]})
    head = ["method", "n", "parsed %", "accuracy %", *[f"{t} %" for t in qtypes]]
    if ref:
        head += [f"Δ vs {ref} (95% CI)", "McNemar p"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, m in result["methods"].items():
        cells = [name, str(m["n"]), f"{100 * m['parse_rate']:.1f}", f"{100 * m['accuracy']:.1f}",
                 *[f"{100 * m['by_qtype'].get(t, float('nan')):.1f}" for t in qtypes]]
        if ref:
            v = m.get("vs_reference")
            if v is None:
                cells += ["(reference)", ""]
            else:
                b = v["bootstrap"]
                cells += [f"{100 * b['delta']:+.1f} [{100 * b['ci_low']:+.1f}, {100 * b['ci_high']:+.1f}]",
                          f"{v['mcnemar']['p_value']:.3g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return (f"Answer accuracy (phrase names the target canonical state), {result['n_common']} common queries\n\n"
            + "\n".join(lines) + "\n")
