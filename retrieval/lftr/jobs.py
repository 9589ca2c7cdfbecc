"""Whole LFTR jobs: predict a run from a checkpoint, the multi-seed study, and the demo pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from eval.benchmark import Benchmark
from eval.io import write_json
from eval.runs import Run, read_run
from eval.stats import seed_summary
from retrieval.encoders import pick_device
from retrieval.lftr.config import LFTRConfig, load_config
from retrieval.lftr.predict import predict_query_vectors, validation_recall
from retrieval.lftr.train import load_checkpoint, prepare, torch_threads, train
from retrieval.runs import score_query_vectors

#: The LFTR config the demo uses on the synthetic benchmark (a few small epochs; see the file).
SYNTH_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "lftr" / "synth.yaml"
#: Cutoffs of the multi-seed summary.
SUMMARY_KS = (1, 5, 10, 20, 50)


def predict_run(bench: Benchmark, ckpt: str | Path, out: str | Path, *, split: str = "test",
                read_rule: str | None = None, method: str = "", k: int = 50, device: str | None = None,
                progress: bool = True, overwrite: bool = False) -> Run:
    """Load a checkpoint, predict the queries of ``split`` under ``read_rule`` and write the run to ``out``
    (a new path or a run file; ``overwrite`` forces, `retrieval.runs.check_run_output`)."""
    device = pick_device(device)
    model, cfg, ck = load_checkpoint(ckpt, device)
    with torch_threads(cfg.threads):
        return _predict_run(bench, model, cfg, ck, ckpt, out, split=split, read_rule=read_rule, method=method, k=k,
                            device=device, progress=progress, overwrite=overwrite)


def _predict_run(bench, model, cfg, ck, ckpt, out, *, split, read_rule, method, k, device, progress,
                 overwrite=False, prep=None) -> Run:
    rule = read_rule or cfg.read_rule
    ckpt_dir = Path(ckpt) if Path(ckpt).is_dir() else Path(ckpt).parent
    prep = prep if prep is not None else prepare(bench, cfg, ckpt_dir, device)
    rows = bench.selection(split)
    t0 = time.time()
    qv = predict_query_vectors(model, prep, rows, rule=rule, seed=cfg.seed, progress=progress, ckpt_dir=ckpt_dir)
    name = method or f"lftr[{cfg.target_space}]" + ("" if rule == "matched" else f"/{rule}")
    config = {**cfg.to_dict(), "read_rule": rule, "checkpoint": str(ckpt), "epoch": ck.get("epoch"),
              "val": ck.get("val"), "split": split, "predict_seconds": round(time.time() - t0, 3)}
    return score_query_vectors(bench, qv, prep.target, out, method=name, config=config, k=k, progress=progress,
                               overwrite=overwrite)


def run_metrics(run: Run, ks: tuple[int, ...] = SUMMARY_KS) -> dict[str, float]:
    """Micro R@k and MRR of the main pool (type2-all) over the queries with GT (eval's tie-aware metrics)."""
    from eval.metrics import mean_valid, per_query_metrics

    pq = per_query_metrics(run, "type2-all", ks=ks, ndcg_k=None)
    out = {f"R@{k}": mean_valid(pq[f"R@{k}"])[0] for k in ks}
    out["MRR"] = mean_valid(pq["RR"])[0]
    return out


def multi_seed(bench: Benchmark, cfg: LFTRConfig, seeds: list[int], out: str | Path, *, split: str = "test",
               log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Train and predict one LFTR per seed into ``out/seed<S>/`` (each resumable) and summarise mean +- std
    (sample std, ddof=1) of R@k and MRR in ``out/summary.json`` and ``out/summary.md``."""
    out = Path(out)
    per_seed: dict[int, dict[str, float]] = {}
    for s in seeds:
        d = out / f"seed{s}"
        c = cfg.with_overrides({"seed": s})
        train(bench, c, d, validate=validation_recall, log=log, progress=progress)
        run_path = d / "run.parquet"
        run = read_run(run_path) if run_path.exists() else predict_run(
            bench, d, run_path, split=split, method=f"lftr[{c.target_space}]-seed{s}", progress=progress)
        per_seed[s] = run_metrics(run)
        log(f"seed {s}: " + ", ".join(f"{k} {v * 100:.2f}" for k, v in per_seed[s].items()))
    keys = list(next(iter(per_seed.values())))
    agg = {k: seed_summary({s: m[k] for s, m in per_seed.items()}) for k in keys}
    mean = {k: agg[k].mean for k in keys}
    std = {k: agg[k].std for k in keys}
    md = ["| metric | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std |",
          "|---|" + "---|" * len(seeds) + "---|"]
    for k in keys:
        md.append(f"| {k} | " + " | ".join(f"{per_seed[s][k] * 100:.2f}" for s in seeds)
                  + f" | {mean[k] * 100:.2f} ± {std[k] * 100:.2f} |")
    summary = {"config": cfg.to_dict(), "seeds": seeds, "split": split, "per_seed": per_seed, "mean": mean,
               "std": std, "markdown": "\n".join(md)}
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(summary["markdown"] + "\n", encoding="utf-8")
    return summary


def run_demo(bench: Benchmark, out: str | Path, *, text_model: str, semantic_space: str = "minilm",
             visual_space: str = "pixels", configs: list[Path] | None = None, seed: int = 0, split: str = "test",
             log: Callable[[str], None] = print, progress: bool = True, extra_spaces: list[str] | None = None,
             compare_space: str = "") -> list[Path]:
    """Every baseline, oracle, LFTR (semantic and visual; and visual reading the last prefix frame only,
    ``lftr-<visual>-last``) and the fusion of the two full LFTR runs into ``out/<method>.parquet``.

    Encodes the semantic space first when it is missing. A run whose file exists is skipped (resumable); LFTR
    checkpoints live in ``out/lftr-<space>/``. The visual space holds the prefix tokens of every method.

    ``extra_spaces`` (e.g. a LiT text -> image space): more target spaces, each with LFTR (prefix: the visual
    space), its state-prototype and independent-appearance oracles, and, when it has a text tower, the
    semantic-text oracle (its zero-shot text -> image R@5 with the true state text) and the question-only baseline;
    then the fusion of all LFTR runs and the complementarity analysis of the LFTR runs (``complementarity.{json,md}``).
    ``compare_space`` (e.g. ``pixels`` next to a learned visual space): LFTR (reading that space's own prefix
    tokens), persistence and the state-prototype oracle there too, for the learned-versus-raw visual comparison.
    """
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.methods import method_query_vectors
    from retrieval.runs import fuse_runs
    from retrieval.spaces import Space

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if semantic_space not in bench.spaces:
        log(f"encoding semantic space {semantic_space!r} with {text_model}")
        encode_space(EncodeConfig(str(bench.root), semantic_space, text_model, kind="semantic"), progress=progress)
    sem, vis = Space.load(bench, semantic_space), Space.load(bench, visual_space)
    rows = bench.selection(split)
    plan = [("random", "random", None), ("question-only", "question-only", sem), ("lookup", "lookup", sem),
            ("knn-future", "knn-future", sem),
            ("persistence", "persistence", vis), ("zero-shot", "zero-shot", vis),
            ("oracle-semantic-text", "semantic-text", sem), ("oracle-state-prototype", "state-prototype", vis),
            *([("oracle-paraphrase", "paraphrase", sem)] if (bench.root / "sim" / "phrases.jsonl").exists() else []),
            ("oracle-independent-appearance", "independent-appearance", vis)]
    paths: list[Path] = []
    timings: dict[str, float] = {}
    for fname, name, space in plan:
        p = out / f"{fname}.parquet"
        paths.append(p)
        if p.exists():
            continue
        t0 = time.time()
        qv = method_query_vectors(bench, name, space, rows, prefix_space=visual_space, seed=seed)
        label = name if space is None else f"{name}[{space.name}]"
        score_query_vectors(bench, qv, space, p, method=label, config={"split": split}, progress=progress)
        timings[fname] = time.time() - t0
        log(f"{fname}: {timings[fname]:.1f}s")
    cfg = load_config(configs or [SYNTH_CONFIG], seed=seed, prefix_space=visual_space,
                      question_space=semantic_space)
    lftr_runs = []
    # (file stem, target space, prefix frames, method): LFTR in both spaces, then the last-frame-only ablation
    # (GenState-AI) in the visual space, so the report shows 8 against 1 prefix frame(s)
    lftr_plan = [(f"lftr-{semantic_space}", semantic_space, cfg.frames, f"lftr[{semantic_space}]"),
                 (f"lftr-{visual_space}", visual_space, cfg.frames, f"lftr[{visual_space}]"),
                 (f"lftr-{visual_space}-last", visual_space, "last", f"lftr[{visual_space}] last frame only")]
    for stem, space, frames, method in lftr_plan:
        p = out / f"{stem}.parquet"
        if not stem.endswith("-last"):
            lftr_runs.append(p)
        paths.append(p)
        if p.exists():
            continue
        t0 = time.time()
        ck = out / stem
        train(bench, cfg.with_overrides({"target_space": space, "frames": frames}), ck, validate=validation_recall,
              log=log, progress=progress)
        predict_run(bench, ck, p, split=split, method=method, progress=progress)
        timings[stem] = time.time() - t0
        log(f"{stem}: {timings[stem]:.1f}s")
    p = out / f"lftr-fusion-{semantic_space}+{visual_space}.parquet"
    paths.append(p)
    if not p.exists():
        fuse_runs(bench, lftr_runs, p, method=f"lftr-fusion[{semantic_space}+{visual_space}]", progress=progress)
    extra = [s for s in (extra_spaces or []) if s not in (semantic_space, visual_space)]
    more = extra + ([compare_space] if compare_space and compare_space not in extra + [visual_space] else [])
    for name in more:
        sp = Space.load(bench, name)
        plan = [("oracle-state-prototype", "state-prototype"), ("oracle-independent-appearance",
                                                                "independent-appearance")]
        if sp.meta.get("text_tower"):
            plan += [("oracle-semantic-text", "semantic-text"), ("question-only", "question-only")]
        if name == compare_space and sp.has_prefixes:
            plan += [("persistence", "persistence")]
        for fname, method in plan:
            p = out / f"{fname}-{name}.parquet"
            paths.append(p)
            if not p.exists():
                qv = method_query_vectors(bench, method, sp, rows, prefix_space=visual_space, seed=seed)
                score_query_vectors(bench, qv, sp, p, method=f"{method}[{name}]", config={"split": split},
                                    progress=progress)
        p = out / f"lftr-{name}.parquet"
        paths.append(p)
        if not p.exists():
            t0 = time.time()
            ck = out / f"lftr-{name}"
            # the compare space is a whole pipeline of its own (its prefixes -> its corpus), so "learned visual space
            # vs raw" compares like with like; an extra target space reads the visual space's prefix tokens
            own = {"prefix_space": name} if name == compare_space and sp.has_prefixes else {}
            train(bench, cfg.with_overrides({"target_space": name, **own}), ck, validate=validation_recall, log=log,
                  progress=progress)
            predict_run(bench, ck, p, split=split, method=f"lftr[{name}]", progress=progress)
            timings[f"lftr-{name}"] = time.time() - t0
        if name in extra:
            lftr_runs.append(p)
    if extra:
        names = [semantic_space, visual_space, *extra]
        p = out / f"lftr-fusion-{'+'.join(names)}.parquet"
        paths.append(p)
        if not p.exists():
            fuse_runs(bench, lftr_runs, p, method=f"lftr-fusion[{'+'.join(names)}]", progress=progress)
        from retrieval.complementarity import complementarity, to_markdown

        res = complementarity(bench, {f"lftr-{n}": r for n, r in zip(names, lftr_runs, strict=True)}, fused=p,
                            geometry_spaces=[compare_space] if compare_space else [])
        write_json(out / "complementarity.json", res)
        (out / "complementarity.md").write_text(to_markdown(res), encoding="utf-8")
    if timings:
        write_json(out / "demo_timings.json", timings)
    return paths
