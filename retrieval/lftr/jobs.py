"""Whole LFTR jobs: predict a run from a checkpoint, the multi-seed study, and the demo pipeline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from eval.atomic import atomic_path
from eval.benchmark import Benchmark
from eval.io import write_json
from eval.runs import Run, read_run
from eval.stats import seed_summary
from retrieval.encoders import pick_device
from retrieval.lftr.config import LFTRConfig, load_config
from retrieval.lftr.predict import predict_query_vectors, validation_recall
from retrieval.lftr.train import load_checkpoint, prepare, torch_threads, train
from retrieval.method_names import run_label
from retrieval.runs import fuse_runs, query_rows_of, score_query_vectors

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
    # the matched, fixed1 and multi_hypothesis reads need the queries' inputs only; calibrated reads validation
    prep = prep if prep is not None else prepare(bench, cfg, ckpt_dir, device,
                                                 targets=rule in ("calibrated", "best_step_oracle"))
    rows = bench.selection(split)
    t0 = time.time()
    qv = predict_query_vectors(model, prep, rows, rule=rule, seed=cfg.seed, progress=progress, ckpt_dir=ckpt_dir)
    name = method or f"lftr[{cfg.target_space}]" + ("" if rule == "matched" else f"/{rule}")
    config = {**cfg.to_dict(), "read_rule": rule, "checkpoint": str(ckpt), "epoch": ck.get("epoch"),
              "val": ck.get("val"), "split": split, "predict_seconds": round(time.time() - t0, 3)}
    return score_query_vectors(bench, qv, prep.target, out, method=name, config=config, k=k, progress=progress,
                               overwrite=overwrite)


def main_recall(bench: Benchmark, run: Run, k: int = 5) -> float:
    """R@k of the main pool over the run's Q1-Q4 queries with GT (the main benchmark's question types)."""
    from eval.metrics import RankStats, mean_valid, recall_at_k
    from eval.schema import MAIN_QTYPES

    qtype = np.asarray(bench.queries_ds["qtype"][:])[query_rows_of(bench, run.query_ids)]
    return mean_valid(recall_at_k(RankStats.from_run(run, "type2-all"), k)[np.isin(qtype, MAIN_QTYPES)])[0]


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


@dataclass
class DemoPlan:
    """The spaces of `run_demo`.

    ``semantic``: the semantic space (states); ``visual``: the visual space whose prefix tokens every LFTR from frames
    reads (and a target space); ``extra``: more target spaces read from the visual space's prefixes (e.g. a LiT
    space); ``compare``: a second visual space run as its own pipeline (its prefixes -> its corpus: learned against
    raw); ``perfect``: a prefix space of the simulator's state (``sim``): LFTR reading it into the semantic space is
    the forecaster with perfect perception ("" or a missing space: none); ``perceived``: a prefix space of a supervised
    perceiver's tokens (`retrieval.perceiver`): LFTR reading it into the semantic space is LFTR from frames through
    that perceiver ("" or a missing space: none)."""

    semantic: str = "minilm"
    visual: str = "pixels"
    extra: list[str] = field(default_factory=list)
    compare: str = ""
    perfect: str = "sim"
    perceived: str = ""

    def targets(self) -> list[str]:
        """The target spaces of LFTR from frames, semantic first."""
        out = [self.semantic, self.visual, *self.extra]
        if self.compare and self.compare not in out:
            out.append(self.compare)
        return list(dict.fromkeys(out))


def _run_name(method: str, seed: int, seeds: list[int]) -> str:
    return f"{method}-seed{seed}" if len(seeds) > 1 else method


def demo_workers(cfg: LFTRConfig, requested: int = 0) -> int:
    """Processes that train the demo's LFTR heads side by side: ``requested`` when positive, else as many as the
    CPUs this process may use hold heads of ``cfg.threads`` threads each (1 when ``threads`` is 0: one head then
    takes every CPU)."""
    from eval.threads import affinity_cpus

    if requested > 0:
        return requested
    return max(1, affinity_cpus() // cfg.threads) if cfg.threads > 0 else 1


@dataclass(frozen=True)
class LFTRJob:
    """One LFTR head of the demo: train ``out/<stem>/`` with ``overrides`` over the demo config, then write its run
    of ``split`` to ``path`` under the run name ``method``."""

    stem: str
    method: str
    split: str
    path: Path
    overrides: dict
    #: where the same worker also writes the head's validation run (read by the fusion selection), or None
    val_path: Path | None = None
    #: a guess of the head's relative cost, for the pool's longest-first order (`jobs_in_pool`)
    cost: float = 0.0
    #: the pool starts the jobs of a lower group first (`jobs_in_pool`): the demo's first seed's heads, then the next
    group: int = 0

    @property
    def done(self) -> bool:
        return self.path.exists() and (self.val_path is None or self.val_path.exists())


def _train_and_predict(bench: Benchmark, cfg: LFTRConfig, out: Path, job: LFTRJob, *, log: Callable[[str], None],
                       progress: bool) -> float:
    """Run one `LFTRJob` (training skipped when its checkpoint already finished) -> seconds taken."""
    t0 = time.time()
    ck = out / job.stem
    c = cfg.with_overrides(job.overrides)
    if not (ck / "best.pt").exists() or not _finished(ck, c):
        train(bench, c, ck, validate=validation_recall, log=log, progress=progress)
    for split, path in ((job.split, job.path), ("val", job.val_path)):
        if path is not None and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            predict_run(bench, ck, path, split=split, method=job.method, progress=progress)
    return time.time() - t0


def _pool_job(root: str, cfg: LFTRConfig, out: str, job: LFTRJob) -> tuple[str, float]:
    """A worker process's `LFTRJob` (no progress bars; its log lines name the head) -> (``stem/split``, seconds)."""
    bench = Benchmark.load(root)
    seconds = _train_and_predict(bench, cfg, Path(out), job,
                                 log=lambda m: print(f"[{job.stem}] {m}", flush=True), progress=False)
    return f"{job.stem}/{job.split}", seconds


class JobsInPool:
    """LFTR jobs (`LFTRJob`) training and predicting in worker processes (`jobs_in_pool`): `wait` for some while this
    process does other work; ``timings``: seconds per ``stem/split`` of those finished."""

    def __init__(self, futures: dict, log: Callable[[str], None], submit: Callable[[LFTRJob], Any] | None = None):
        self.futures, self.timings, self.log, self._submit = futures, {}, log, submit
        for f in futures.values():
            f.add_done_callback(self._finished)

    def submit(self, jobs: list[LFTRJob]) -> list[LFTRJob]:
        """Queue more ``jobs`` behind those already queued (heads whose runs exist skipped); returns those this pool
        will not run (all of them when its workers are gone: the caller runs them itself)."""
        if self._submit is None:
            return [j for j in jobs if not j.done]
        for j in jobs:
            if not j.done and j.stem not in self.futures:
                self.futures[j.stem] = f = self._submit(j)
                f.add_done_callback(self._finished)
        return []

    def _finished(self, f) -> None:
        if f.cancelled() or f.exception() is not None:
            return
        key, seconds = f.result()
        self.timings[key] = seconds
        self.log(f"{key}: {seconds:.1f}s")

    def wait(self, jobs: list[LFTRJob]) -> None:
        """Block until ``jobs`` are finished (those not in the pool at once); a worker's error is raised here."""
        for j in jobs:
            if j.stem in self.futures:
                self.futures[j.stem].result()


@contextlib.contextmanager
def jobs_in_pool(bench: Benchmark, cfg: LFTRConfig, out: Path, jobs: list[LFTRJob], workers: int,
                 log: Callable[[str], None] = print) -> Iterator[JobsInPool]:
    """Train and predict ``jobs`` in ``workers`` processes (spawned: each loads the benchmark memory-mapped and
    trains with ``cfg.threads`` threads), heads whose runs exist skipped. They start by `LFTRJob.group`, then longest
    first (by `LFTRJob.cost`), so a group finishes early (the caller `JobsInPool.wait` s for it and works on its
    runs meanwhile) and the last to finish is a short one. Each head is seeded by its own config, so its checkpoint
    and runs are those the same job writes alone, whatever the order. The workers are stopped when the block ends
    on an error."""
    from eval.pools import process_pool

    todo = sorted((j for j in jobs if not j.done), key=lambda j: (j.group, -j.cost))
    if not todo:
        yield JobsInPool({}, log)  # nothing to train: jobs submitted later run in the caller's process
        return
    if cfg.question_space and cfg.condition_question:  # every head reads them: embed once, here, into the cache
        from retrieval.lftr.data import cache_dir, question_embeddings

        question_embeddings(bench, cfg.question_space, cache_dir(bench, out / "cache"))
    log(f"training {len(todo)} LFTR heads in {min(workers, len(todo))} processes")
    with process_pool(min(workers, len(todo))) as pool:
        def submit(j: LFTRJob):
            return pool.submit(_pool_job, str(bench.root), cfg, str(out), j)

        running = JobsInPool({j.stem: submit(j) for j in todo}, log, submit)
        yield running
        for f in list(running.futures.values()):
            f.result()


def run_demo(bench: Benchmark, out: str | Path, *, text_model: str, plan: DemoPlan, configs: list[Path] | None = None,
             seeds: list[int] | None = None, split: str = "test", log: Callable[[str], None] = print,
             progress: bool = True, workers: int = 0) -> list[Path]:
    """Every baseline and oracle, LFTR in every target space per seed, perfect-perception LFTR, the fusions and the
    complementarity analysis into ``out/<stem>.parquet`` (resumable: a run whose file exists is skipped; LFTR
    checkpoints live in ``out/<stem>/``).

    - baselines: random, question-only, lookup, the transition table (the true current state + a table fitted on
      train), kNN-future (semantic space); with the perfect-perception space, ``state-classifier-<perfect>[<semantic>]``
      (`retrieval.classifier`: an MLP from the same input as ``lftr-sim`` to the future state); persistence and
      zero-shot (visual space, and the compare space);
    - oracles: semantic-text and the held-out paraphrase (semantic space); state-prototype and independent-appearance
      in every visual target space; a text -> image space's semantic-text oracle and question-only baseline;
    - LFTR per seed (``seeds``; run names end in ``-seed<S>`` when there are several, so reports show mean ± std):
      ``lftr[<space>]`` for every target space of `DemoPlan.targets` (prefix: the visual space; the compare space
      reads its own prefixes), ``lftr-sim[<semantic>]`` (prefix: the perfect-perception space),
      ``lftr-<perceived>[<semantic>]`` (prefix: the perceiver's space), and, for the first seed,
      ``lftr[<visual>] last frame only`` (GenState-AI's 8-vs-1-frame ablation);
    - fusion: the pair (semantic + one visual target space) with the best validation R@5 and the fusion of every
      target space, per seed (the paper reports both: its two-space fusion and the stack of App. I); the better of the
      two on validation is the headline, the reference of the report's tests (`_select_fusion`; first seed; written
      to ``fusion_selection.json``);
    - through the perceiver, as the paper fuses the heads of its strongest prefix encoder: the first seed's LFTR from
      the perceiver's space into every visual target space (with validation runs); the one whose fusion with
      ``lftr-<perceived>[<semantic>]`` is best on validation (`_select_perceived_fusion`,
      ``fusion_selection_<perceived>.json``) is trained for the later seeds too, queued in the running pool, and each
      seed's pair is fused into ``lftr-<perceived>-fusion[<semantic>+<space>]``;
    - ``complementarity.{json,md}`` of the first seed's LFTR runs, over the main table's population (fair ``split``
      queries of Q1-Q4);
    - ``perception.{json,md}`` on a build with the simulator's truth: how much of the present state a linear probe
      reads from each space holding prefix tokens (`retrieval.perception`).

    The LFTR heads train side by side in ``workers`` processes (0: `demo_workers`), the first seed's first, while
    this process scores the baselines and oracles and then fuses each seed's heads as soon as they are done; each
    head writes the files it writes alone."""
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.methods import method_query_vectors
    from retrieval.spaces import Space

    if plan.perceived and plan.perceived not in bench.spaces:
        from eval.errors import MissingInput

        raise MissingInput(f"{bench.root}: no space {plan.perceived!r} for --perceived-space (spaces: "
                           f"{sorted(bench.spaces)})", fix="train a perceiver on another world and encode it: "
                           "`python -m retrieval encoder perceiver --data WORLD --out DIR`, then `python -m retrieval "
                           f"encode --data {bench.root} --space {plan.perceived} --model DIR`")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(seeds or [0])
    if plan.semantic not in bench.spaces:
        log(f"encoding semantic space {plan.semantic!r} with {text_model}")
        encode_space(EncodeConfig(str(bench.root), plan.semantic, text_model, kind="semantic"), progress=progress)
    spaces = {n: Space.load(bench, n) for n in plan.targets()}
    sem, vis = spaces[plan.semantic], spaces[plan.visual]
    rows = bench.selection(split)
    paths: list[Path] = []
    timings: dict[str, float] = {}

    def method_run(stem: str, name: str, space, label: str = "", prefix_space: str = "", **kw) -> None:
        p = out / f"{stem}.parquet"
        paths.append(p)
        if p.exists():
            return
        t0 = time.time()
        qv = method_query_vectors(bench, name, space, rows, prefix_space=prefix_space or plan.visual, seed=seeds[0],
                                  progress=progress, **kw)
        score_query_vectors(bench, qv, space, p, method=label or run_label(name, space.name if space else None),
                            config={"split": split, **({"fit": qv.info} if qv.info else {})}, progress=progress)
        timings[stem] = time.time() - t0
        log(f"{stem}: {timings[stem]:.1f}s")

    def baselines_and_oracles() -> None:
        method_run("random", "random", None)
        for name in ("question-only", "lookup", "transition-table", "knn-future"):
            method_run(name, name, sem)
        if plan.perfect and plan.perfect in bench.spaces:  # a second perfect-perception forecaster, not LFTR
            method_run(f"state-classifier-{plan.perfect}", "state-classifier", sem,
                       label=f"state-classifier-{plan.perfect}[{plan.semantic}]", prefix_space=plan.perfect)
        for name in ("persistence", "zero-shot"):
            method_run(name, name, vis)
        method_run("oracle-semantic-text", "semantic-text", sem)
        if (bench.root / "sim" / "phrases.jsonl").exists():
            method_run("oracle-paraphrase", "paraphrase", sem)
        for n, sp in spaces.items():
            if sp.kind != "visual":
                continue
            suffix = "" if n == plan.visual else f"-{n}"
            for name in ("state-prototype", "independent-appearance"):
                method_run(f"oracle-{name}{suffix}", name, sp)
            if sp.meta.get("text_tower"):
                method_run(f"oracle-semantic-text{suffix}", "semantic-text", sp)
                method_run(f"question-only{suffix}", "question-only", sp)
            if n == plan.compare and sp.has_prefixes:
                method_run(f"persistence{suffix}", "persistence", sp)

    cfg = load_config(configs or [SYNTH_CONFIG], prefix_space=plan.visual, question_space=plan.semantic)

    def job(stem: str, method: str, seed: int, split_: str = split, **over) -> LFTRJob:
        p = out / f"{stem}.parquet" if split_ == split else out / "val" / f"{stem}.parquet"
        return LFTRJob(stem, method, split_, p, {"seed": seed, **over})

    def run_job(j: LFTRJob) -> Path:
        if not j.done:
            key = f"{j.stem}/{j.split}"
            timings[key] = _train_and_predict(bench, cfg, out, j, log=log, progress=progress)
            log(f"{key}: {timings[key]:.1f}s")
        return j.path

    def lftr_run(stem: str, method: str, seed: int, split_: str = split, **over) -> Path:
        return run_job(job(stem, method, seed, split_, **over))

    def cost(target: str, scale: float = 1.0) -> float:
        """A head's relative cost for the pool's order: its per-epoch validation and its runs score every query
        against the target space's items, so heads into the larger spaces take longest."""
        return scale * spaces[target].n_items * spaces[target].dim

    def perceived_job(target: str, seed: int) -> LFTRJob:
        """LFTR from the perceiver's prefix tokens into ``target``."""
        stem, name = f"lftr-{plan.perceived}-{target}", f"lftr-{plan.perceived}[{target}]"
        return job(_run_name(stem, seed, seeds), _run_name(name, seed, seeds), seed, target_space=target,
                   prefix_space=plan.perceived)

    perceived_visual = [n for n in plan.targets() if n != plan.semantic] if plan.perceived else []
    heads: list[tuple[int, str, LFTRJob]] = []  # (seed, key in per_seed, job) in the order the runs are listed
    for g, seed in enumerate(seeds):
        for n in plan.targets():
            own = {"prefix_space": n} if n == plan.compare and spaces[n].has_prefixes else {}
            j = job(_run_name(f"lftr-{n}", seed, seeds), _run_name(f"lftr[{n}]", seed, seeds), seed, target_space=n,
                    **own)
            # the first seed's heads also write their validation runs, which the fusion selection reads
            val = out / "val" / f"{j.stem}.parquet" if seed == seeds[0] else None
            heads.append((seed, n, replace(j, val_path=val, cost=cost(n), group=g)))
        if plan.perfect and plan.perfect in bench.spaces:
            stem, name = f"lftr-sim-{plan.semantic}", f"lftr-sim[{plan.semantic}]"
            j = job(_run_name(stem, seed, seeds), _run_name(name, seed, seeds), seed, target_space=plan.semantic,
                    prefix_space=plan.perfect)
            heads.append((seed, "perfect", replace(j, cost=cost(plan.semantic, 1.01), group=g)))  # reads more dims
        if plan.perceived:  # present: checked above
            j = perceived_job(plan.semantic, seed)
            val = out / "val" / f"{j.stem}.parquet" if seed == seeds[0] else None
            heads.append((seed, "perceived", replace(j, val_path=val, cost=cost(plan.semantic), group=g)))
            if seed == seeds[0]:  # its fusion's visual target is chosen on these heads' validation runs
                for n in perceived_visual:
                    j = perceived_job(n, seed)
                    heads.append((seed, f"perceived:{n}", replace(j, val_path=out / "val" / f"{j.stem}.parquet",
                                                                  cost=cost(n), group=g)))
    last = replace(job(f"lftr-{plan.visual}-last", f"lftr[{plan.visual}] last frame only", seeds[0],
                       target_space=plan.visual, frames="last"), cost=cost(plan.visual, 0.99),  # one prefix frame
                   group=len(seeds) - 1)
    n_workers = demo_workers(cfg, workers)
    singles = [n for n in plan.targets()]
    per_seed: dict[int, dict[str, Path]] = {s: {} for s in seeds}
    fused: dict[tuple[str, int], Path] = {}
    with contextlib.ExitStack() as stack:
        # the heads train in the pool's processes while this one scores the baselines and oracles, then fuses
        # each seed's heads as soon as they are done
        pool = (stack.enter_context(jobs_in_pool(bench, cfg, out, [j for _, _, j in heads] + [last], n_workers, log))
                if n_workers > 1 else None)
        baselines_and_oracles()
        _perception(bench, out, plan, timings, log)
        pair = perceived_pair = None
        for g, seed in enumerate(seeds):
            mine = [(key, j) for s, key, j in heads if s == seed]
            if pool is not None:
                pool.wait([j for _, j in mine])
            for key, j in mine:
                per_seed[seed][key] = run_job(j)
            if pair is None:
                pair, _ = _select_fusion(bench, out, plan, singles, seeds, per_seed, lftr_run, cfg, log, progress)
            if perceived_visual and perceived_pair is None:
                perceived_pair = _select_perceived_fusion(bench, out, plan, perceived_visual, per_seed[seed], heads,
                                                          log, progress)
                later = [(s, f"perceived:{perceived_pair}", replace(perceived_job(perceived_pair, s),
                                                                     cost=cost(perceived_pair), group=g + 1 + i))
                         for i, s in enumerate(seeds[1:])]
                heads += later
                if pool is not None:
                    pool.submit([j for _, _, j in later])
            if perceived_pair is not None:
                members = f"{plan.semantic}+{perceived_pair}"
                name = f"lftr-{plan.perceived}-fusion"
                p = out / f"{_run_name(f'{name}-{members}', seed, seeds)}.parquet"
                fused[f"{plan.perceived}:{members}", seed] = p
                if not p.exists():
                    fuse_runs(bench, [per_seed[seed]["perceived"], per_seed[seed][f"perceived:{perceived_pair}"]], p,
                              method=_run_name(f"{name}[{members}]", seed, seeds), progress=progress)
            for members in ([plan.semantic, pair], singles) if len(singles) > 2 else ([plan.semantic, pair],):
                label = "+".join(members)
                p = fused[label, seed] = out / f"{_run_name(f'lftr-fusion-{label}', seed, seeds)}.parquet"
                if not p.exists():
                    fuse_runs(bench, [per_seed[seed][m] for m in members], p,
                              method=_run_name(f"lftr-fusion[{label}]", seed, seeds), progress=progress)
        if pool is not None:
            pool.wait([last])
        last_path = run_job(last)
    if pool is not None:
        timings.update(pool.timings)
    for seed in seeds:
        paths += list(per_seed[seed].values())
    paths.append(last_path)
    for label in dict.fromkeys(label for label, _ in fused):
        paths += [fused[label, seed] for seed in seeds]
    if len(singles) > 1:
        from eval.evaluate import Population
        from retrieval.complementarity import complementarity, to_markdown

        first = per_seed[seeds[0]]
        stack_run = out / f"{_run_name('lftr-fusion-' + '+'.join(singles), seeds[0], seeds)}.parquet"
        res = complementarity(bench, {f"lftr-{n}": first[n] for n in singles},
                              fused=stack_run if stack_run.exists() else None,
                              geometry_spaces=[plan.compare] if plan.compare else [], population=Population((split,)))
        write_json(out / "complementarity.json", res)
        (out / "complementarity.md").write_text(to_markdown(res), encoding="utf-8")
    if timings:
        write_json(out / "demo_timings.json", timings)
    return paths


def _perception(bench: Benchmark, out: Path, plan: DemoPlan, timings: dict[str, float],
                log: Callable[[str], None]) -> None:
    """``out/perception.{json,md}`` (`retrieval.perception`): the present state read from each space holding prefix
    tokens (the visual, extra and compare spaces, the perceiver's, then the perfect-perception one), on a build with
    the simulator's truth; skipped without it, and when ``perception.json`` exists (resumable)."""
    from retrieval.perception import has_truth, perception, to_markdown
    from retrieval.spaces import Space

    path = out / "perception.json"
    if path.exists() or not has_truth(bench):
        return
    names = [n for n in dict.fromkeys([plan.visual, *plan.extra, plan.compare, plan.perceived, plan.perfect])
             if n and n in bench.spaces and Space.load(bench, n).has_prefixes]
    if not names:
        return
    t0 = time.time()
    res = perception(bench, names)
    with atomic_path(out / "perception.md") as tmp:
        tmp.write_text(to_markdown(res), encoding="utf-8")
    write_json(path, res)
    timings["perception"] = time.time() - t0
    log(f"perception: {timings['perception']:.1f}s")


def _finished(ck: Path, cfg: LFTRConfig) -> bool:
    """The checkpoint folder holds a finished training of ``cfg`` (its last epoch recorded)."""
    hist = ck / "history.jsonl"
    if not hist.exists():
        return False
    lines = [ln for ln in hist.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return len(lines) >= cfg.epochs


def _select_perceived_fusion(bench: Benchmark, out: Path, plan: DemoPlan, candidates: list[str], first: dict,
                             heads: list, log: Callable[[str], None], progress: bool) -> str:
    """The visual target space of LFTR through the perceiver (``lftr-<perceived>[...]``) whose fusion with its
    semantic head has the best validation R@5 (Q1-Q4 queries with GT; the first seed's heads; the lower index on a
    tie), never chosen on test; recorded in ``out/fusion_selection_<perceived>.json``. ``first``: the first seed's
    test runs by head key; ``heads``: the demo's ``(seed, key, job)`` list, whose first-seed jobs name the validation
    runs."""
    import json

    f = out / f"fusion_selection_{plan.perceived}.json"
    if f.exists():
        chosen = json.loads(f.read_text(encoding="utf-8")).get("chosen")
        if chosen in candidates:
            return chosen
    val = {key: j.val_path for _, key, j in heads if j.val_path is not None and key.startswith("perceived")}
    missing = [k for k in ["perceived", *(f"perceived:{n}" for n in candidates)] if k not in val or k not in first]
    if missing:
        raise RuntimeError(f"the perceiver's fusion selection lacks the first seed's heads {missing}")
    runs = {k: read_run(v) for k, v in val.items()}
    scores = {}
    for n in candidates:
        members = f"{plan.semantic}+{n}"
        p = out / "val" / f"lftr-{plan.perceived}-fusion-{members}.parquet"
        run = read_run(p) if p.exists() else fuse_runs(bench, [val["perceived"], val[f"perceived:{n}"]], p,
                                                         method=f"lftr-{plan.perceived}-fusion[{members}]",
                                                         progress=progress)
        scores[n] = main_recall(bench, run)
    chosen = max(candidates, key=lambda n: (scores[n], -candidates.index(n)))
    singles = {k.split(":")[-1] if ":" in k else plan.semantic: main_recall(bench, r) for k, r in runs.items()}
    write_json(f, {"chosen": chosen, "val_R@5": scores, "singles_val_R@5": singles, "prefix_space": plan.perceived,
                   "rule": f"the visual target space whose fusion with lftr-{plan.perceived}[{plan.semantic}] has the "
                           "best validation R@5 (first seed; the earlier space on a tie)"})
    log(f"perceiver fusion chosen on validation: {plan.semantic}+{chosen} (" + ", ".join(
        f"{n} {100 * v:.2f}" for n, v in scores.items()) + ")")
    return chosen


def _select_fusion(bench: Benchmark, out: Path, plan: DemoPlan, singles: list[str], seeds: list[int],
                   per_seed: dict, lftr_run, cfg: LFTRConfig, log, progress: bool) -> tuple[str, list[str]]:
    """The fusions of the demo, chosen on the validation split (the first seed's LFTRs; Q1-Q4 queries with GT), never
    on test; recorded in ``out/fusion_selection.json``. Returns ``(pair, headline)``:

    - ``pair``: the visual target space whose fusion with the semantic space has the best validation R@5 (the paper's
      two-space fusion);
    - ``headline``: the members of the fusion the report's significance tests take as their reference, the better on
      validation of that pair and, with more than two target spaces, the fusion of every target space (App. I's
      stack); on a tie the one of fewer spaces."""
    import json

    f = out / "fusion_selection.json"
    visual = [n for n in singles if n != plan.semantic]
    stack = singles if len(singles) > 2 else None
    if f.exists():
        sel = json.loads(f.read_text(encoding="utf-8"))
        chosen, headline = sel.get("chosen"), sel.get("headline")
        if chosen in visual and headline is not None and headline in ([plan.semantic, chosen], stack):
            return chosen, headline
    seed = seeds[0]
    val = {}
    for n in [plan.semantic, *visual]:
        own = {"prefix_space": n} if n == plan.compare and n != plan.visual else {}
        val[n] = lftr_run(_run_name(f"lftr-{n}", seed, seeds), f"lftr[{n}]", seed, split_="val", target_space=n,
                          **own)

    def val_fusion(members: list[str]) -> float:
        label = "+".join(members)
        p = out / "val" / f"lftr-fusion-{label}.parquet"
        run = read_run(p) if p.exists() else fuse_runs(bench, [val[m] for m in members], p,
                                                         method=f"lftr-fusion[{label}]", progress=progress)
        return main_recall(bench, run)

    scores = {n: val_fusion([plan.semantic, n]) for n in visual}
    chosen = max(visual, key=lambda n: (scores[n], -visual.index(n)))
    fusions = {"+".join([plan.semantic, chosen]): scores[chosen]}
    if stack is not None:
        fusions["+".join(stack)] = val_fusion(stack)
    best = max(fusions, key=lambda label: (fusions[label], -label.count("+")))
    headline = best.split("+")
    singles_val = {n: main_recall(bench, read_run(val[n])) for n in [plan.semantic, *visual]}
    write_json(f, {"chosen": chosen, "val_R@5": scores, "headline": headline, "fusions_val_R@5": fusions,
                   "singles_val_R@5": singles_val, "seed": seed,
                   "rule": "pair: the visual target space whose fusion with the semantic space has the best "
                           "validation R@5; headline: the better on validation R@5 of that pair and the fusion of "
                           "every target space, the one of fewer spaces on a tie (first seed)"})
    log(f"fusion chosen on validation: {plan.semantic}+{chosen} (" + ", ".join(f"{n} {100 * v:.2f}"
                                                                                for n, v in scores.items()) + ")")
    log("headline fusion chosen on validation: " + best + " (" + ", ".join(
        f"{label} {100 * v:.2f}" for label, v in fusions.items()) + ")")
    return chosen, headline
