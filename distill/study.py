"""Three students at equal budget, several seeds, scored with video-clustered CIs: ``python -m distill study``.

The students are the three SFT targets over the same queries and prompts (`distill.narrate.TARGET_VARIANTS`):
``answer`` (answer-only), ``trajectory`` (the answer plus the intermediate state labels, no reasoning text) and
``cot`` (the rationale). Each is trained (`distill.train.train`, the recipe's ``train:`` section of ``--config``)
once per seed and per budget, in this process or, with ``--workers``, side by side in processes of one thread each
(a small student on a CPU trains faster on one thread than on several, so two processes on two cores nearly halve
the wall time; each student writes only its own folder, so its files are those it writes alone):

- ``steps:N``: every student makes the same N optimizer steps;
- ``epochs:E``: every student sees its training set E times.

The three sets hold the same examples and the effective batch is the same, so an epoch is the same number of
optimizer steps for every student; the two budgets differ in length, and what differs between students at either
budget is the supervised tokens (reported per student: CoT supervises a hundred-word rationale, answer-only a few
words). A finished run is a no-op (`distill.train.finished_metrics`), so a rerun resumes where it stopped.

Each student answers the test queries of the predicate file (the closed slice on CPU) greedily, with the input it
was trained on (`distill.evidence.student_request`); the answers are written as phrase files
(``phrases/<budget>/<variant>-s<seed>.jsonl``) and read like every other phrase source (`distill.answers`):

- ``exact``: the parsed phrase is a phrasing of the target canonical state;
- ``motion``: the simulator motion class of the named state equals the target's (a state's motion class is the most
  common ``motion`` field of its corpus segments' ``sim_state``; a phrase naming no state is a miss).

Per student, the hits are averaged over the seeds query by query, then (with ``n`` test queries from ``C`` videos)
``acc = mean_q hit_q`` with a 95% CI from a bootstrap over videos (`distill.faithfulness.cluster_bootstrap`); the
paired differences CoT - answer-only, CoT - trajectory-labels and trajectory-labels - answer-only use the paired
video bootstrap of `distill.answers.video_bootstrap` on the seed-averaged hits. Floors: the majority class (the most
frequent train target, predicted for every query) and ``1/K``.

Faithfulness (`distill.faithfulness`) of every CoT student over the same sampled test queries, pooled over seeds:
``moved`` beside the shuffled-body floor and ``1/K``, and ``moved_given_gold``.

Writes ``<out>/study.json`` (everything, seconds included) and ``<out>/study.md``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import InputError, MissingInput

VARIANT_NAMES = {"answer": "answer-only", "trajectory": "trajectory-labels", "cot": "CoT"}
PAIRS = (("cot", "answer"), ("cot", "trajectory"), ("trajectory", "answer"))
READS = ("exact", "motion")


@dataclass
class StudyConfig:
    """``python -m distill study``: three students at equal budget over seeds, exact and motion-class accuracy with
    video-clustered CIs, and the CoT students' faithfulness against its floors."""

    data: str = field(metadata={"help": "benchmark directory"})
    sft: str = field(metadata={"help": "SFT sets directory (python -m distill sft): <sft>/cot, answer, trajectory"})
    predicates: str = field(metadata={"help": "predicates JSONL (its test queries are scored; donors of the "
                                              "faithfulness check come from it)"})
    out: str = field(metadata={"help": "output directory"})
    train_config: str = field(metadata={"help": "preset whose train: section trains every student (distill.train)"})
    model: str | None = field(default=None, metadata={
        "help": "base model (default: the preset's train.model_name_or_path)"})
    variants: list[str] = field(default_factory=lambda: ["answer", "trajectory", "cot"], metadata={
        "help": "students (SFT variants)"})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "training seeds"})
    budgets: list[str] = field(default_factory=lambda: ["steps:100", "epochs:2"], metadata={
        "help": "steps:N (equal optimizer steps) | epochs:E (equal epochs)"})
    split: str = field(default="test", metadata={"help": "queries scored"})
    limit: int | None = field(default=None, metadata={"help": "score at most N queries (stratified by video)"})
    max_new_tokens: int = field(default=320, metadata={"help": "generation budget of every student"})
    batch_size: int = field(default=128, metadata={
        "help": "queries per generate call (the faithfulness check: a quarter of it, four prompts a query)"})
    faithfulness_limit: int | None = field(default=None, metadata={
        "help": "faithfulness: at most N queries, stratified by video (null: every eligible one)"})
    faithfulness_max_new_tokens: int = field(default=16, metadata={"help": "tokens decoded after 'Answer:'"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples (over videos)"})
    num_threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's)"})
    workers: int = field(default=1, metadata={
        "help": "processes training and answering students side by side, one torch thread each (0: one per CPU "
                "this process may use; 1: every student in this process, one after another)"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    def __post_init__(self):
        from distill.sft import VARIANTS

        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise InputError(f"variants must be a non-empty subset of {VARIANTS}, got {self.variants}")
        if not self.seeds:
            raise InputError("seeds must not be empty")
        for b in self.budgets:
            Budget.parse(b)
        if self.workers < 0:
            raise InputError(f"workers must be >= 0, got {self.workers}")


@dataclass(frozen=True)
class Budget:
    """One training budget: ``steps:N`` or ``epochs:E`` (the flags it adds to `distill.train`)."""

    kind: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Budget:
        kind, sep, value = text.partition(":")
        try:
            v = float(value)
        except ValueError:
            v = -1.0
        if not sep or kind not in ("steps", "epochs") or v <= 0 or (kind == "steps" and not v.is_integer()):
            raise InputError(f"budget {text!r}: expected steps:N (N >= 1) or epochs:E (E > 0)")
        return cls(kind, v)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.value:g}"

    def flags(self) -> list[str]:
        if self.kind == "steps":
            return ["--max_steps", str(int(self.value))]
        return ["--num_train_epochs", f"{self.value:g}", "--max_steps", "-1"]


# --- training --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One training run of the study: its directory name and `distill.train` flags, and the snapshot steps it
    writes (equal-steps students nested in an equal-epochs run)."""

    name: str
    flags: tuple[str, ...]
    snapshots: tuple[int, ...] = ()


def plan_runs(cfg: StudyConfig) -> tuple[dict[str, Run], dict[str, tuple[str, int | None]]]:
    """(runs by name, budget name -> (run name, snapshot step or None)). Under a constant learning rate without
    warmup, a ``steps:N`` budget no longer than an ``epochs:E`` budget's run is that run's snapshot at step N: the
    same seed, data order and updates as a run stopped at N (tests/distill/test_study.py checks the weights are
    equal), so it costs no training of its own; otherwise it is a run of its own."""
    from distill.sft import read_set_info
    from distill.train_args import parse_train_args

    budgets = [Budget.parse(b) for b in cfg.budgets]
    psr, sft, _ = parse_train_args(["--config", cfg.train_config, "--dataset_name", str(Path(cfg.sft) / cfg.variants[0]),
                                  "--output_dir", str(Path(cfg.out) / "students"),
                                  *(["--model_name_or_path", cfg.model] if cfg.model else [])])
    info = read_set_info(Path(cfg.sft) / cfg.variants[0]) or {}
    n = int((info.get("splits") or {}).get("train", 0))
    constant = sft.lr_scheduler_type in ("constant", "SchedulerType.CONSTANT") and not sft.warmup_steps
    batch = psr.effective_batch_size or sft.per_device_train_batch_size * max(1, sft.gradient_accumulation_steps)
    per_epoch = -(-n // batch) if n else 0
    runs: dict[str, Run] = {}
    where: dict[str, tuple[str, int | None]] = {}
    epochs = [b for b in budgets if b.kind == "epochs"]
    for b in epochs:
        runs[b.name] = Run(b.name, tuple(b.flags()))
        where[b.name] = (b.name, None)
    for b in (b for b in budgets if b.kind == "steps"):
        host = next((e for e in epochs if constant and int(b.value) <= int(e.value) * per_epoch), None)
        if host is None:
            runs[b.name] = Run(b.name, tuple(b.flags()))
            where[b.name] = (b.name, None)
        else:
            r = runs[host.name]
            runs[host.name] = Run(r.name, r.flags, tuple(sorted({*r.snapshots, int(b.value)})))
            where[b.name] = (host.name, int(b.value))
    return runs, where


def run_dir(cfg: StudyConfig, run: str, variant: str, seed: int) -> Path:
    return Path(cfg.out) / "students" / run / f"{variant}-s{seed}"


def train_student(cfg: StudyConfig, run: Run, variant: str, seed: int) -> dict[str, Any]:
    """Train (or find finished) one run; its metrics plus the supervised tokens of its set."""
    from distill.train import train
    from distill.train_args import parse_train_args
    from eval.io import read_json

    out = run_dir(cfg, run.name, variant, seed)
    argv = ["--config", cfg.train_config, "--dataset_name", str(Path(cfg.sft) / variant), "--output_dir", str(out),
            "--seed", str(seed), *run.flags, *(["--model_name_or_path", cfg.model] if cfg.model else []),
            *(["--snapshot_steps", *map(str, run.snapshots)] if run.snapshots else [])]
    psr, sft, model_args = parse_train_args(argv)
    c0 = time.process_time()
    metrics = train(psr, sft, model_args)
    cpu = time.process_time() - c0
    conf = read_json(out / "train.config.json")
    return {"global_step": metrics.get("global_step"), "train_loss": metrics.get("train_loss"),
            "last_loss": metrics.get("last_loss"), "wall_s": metrics.get("wall_s"),
            "cpu_s": metrics.get("cpu_s") if metrics.get("skipped") else round(cpu, 1),
            "skipped": bool(metrics.get("skipped")), "epoch": metrics.get("epoch"),
            "examples": conf.get("examples", {}).get("train"), "supervised_tokens": conf.get("supervised_tokens"),
            "effective_batch_size": metrics.get("effective_batch_size"), "base_model": model_args.model_name_or_path}


# --- predictions -----------------------------------------------------------------------------------------------

def serve(weights: Path, full: bool, base: str, *, device: str, batch_size: int):
    """The hf backend serving a trained student (a full model directory, or an adapter on its base)."""
    from forecasters.backends.hf import HFBackend, HFConfig

    model, adapter = (str(weights), None) if full else (base, str(weights))
    return HFBackend(HFConfig(model=model, adapter=adapter, device=device, batch_size=batch_size))


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def predict(cfg: StudyConfig, backend, queries: list, bench, student: dict[str, Any], path: Path) -> dict[str, Any]:
    """The student's answers to ``queries`` as a phrase file at ``path`` (reused when the same student, queries and
    decoding wrote it: ``<path>.config.json``); returns {seconds, reused}."""
    from distill.evidence import EvidenceIndex, student_request, student_template
    from eval.io import read_json, write_json, write_jsonl
    from eval.phrases import PhraseRecord
    from forecasters.backends import SamplingParams
    from forecasters.media import FrameCache
    from forecasters.parsing import parse_answer_line

    pre = student["preprocessing"]
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.max_new_tokens)
    ident = {"student": student["config_hash"], "queries": _hash([q.id for q in queries]),
             "decoding": sampling.to_dict(), "weights": str(student["weights"])}
    side = path.with_name(path.name.removesuffix(".jsonl") + ".config.json")
    if path.is_file() and side.is_file() and read_json(side).get("identity") == ident:
        old = read_json(side)
        return {"seconds": old.get("seconds", 0.0), "cpu_s": old.get("cpu_s"), "reused": True}
    t0, c0 = time.perf_counter(), time.process_time()
    template = student_template(pre.get("student_input") or "frames")
    index = EvidenceIndex(bench) if pre.get("student_input") == "evidence" else None
    frames = FrameCache(bench.root, max_pixels=pre.get("max_pixels"))
    reqs = [student_request(q, bench, student_input=pre.get("student_input") or "frames", template=template,
                            frame_cache=frames, frames=pre.get("frames"), index=index, sampling=sampling)
            for q in queries]
    comps = backend.generate(reqs)
    rows = []
    for q, c in zip(queries, comps, strict=True):
        raw = c.texts[0] if c.ok else None
        p = parse_answer_line(raw) if c.ok else None
        rows.append(PhraseRecord(query_id=q.id, phrase=p.phrase if p else None, raw=raw, model=str(student["weights"]),
                                 backend="hf", forecaster="student", prompt_id=template.id,
                                 prompt_hash=template.hash, decoding=sampling.to_dict(), config_hash=ident["student"],
                                 error=None if c.ok else f"{c.error_kind}: {c.error}",
                                 parse_ok=bool(p and p.ok), flags=list(p.flags) if p else []).to_dict())
    write_jsonl(path, rows)
    seconds, cpu = round(time.perf_counter() - t0, 2), round(time.process_time() - c0, 2)
    write_json(side, {"identity": ident, "seconds": seconds, "cpu_s": cpu})
    return {"seconds": seconds, "cpu_s": cpu, "reused": False}


# --- scoring ---------------------------------------------------------------------------------------------------

def motion_classes(bench) -> dict[str, str]:
    """canonical state -> its simulator motion class: the most common ``motion`` field (the first of the
    ``sim_state`` key ``motion|place|relation|other|pose``) of its corpus segments (ties: alphabetical);
    empty when the corpus has no ``sim_state``."""
    from eval.synth.lexicon import TrueState

    c = bench.corpus_ds
    if "sim_state" not in c.column_names:
        return {}
    counts: dict[str, Counter] = {}
    for state, sim in zip(c["state"][:], c["sim_state"][:], strict=True):
        if TrueState.is_key(sim):
            counts.setdefault(state, Counter())[sim.split("|", 1)[0]] += 1
    return {s: min(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[0] for s, cnt in counts.items()}


def hits(phrase_file: Path, queries: list, lookup: dict[str, str], motion: dict[str, str]) -> dict[str, np.ndarray]:
    """Per query (in order): 1.0 when the answer names the target (``exact``) / its motion class (``motion``)."""
    from distill.answers import exact_states
    from eval.phrases import read_phrases

    recs = read_phrases(phrase_file)
    named = exact_states(recs, [q.id for q in queries], lookup)
    out = {"exact": np.asarray([float(s == q.target_state) for s, q in zip(named, queries, strict=True)])}
    if motion:
        out["motion"] = np.asarray([float(s is not None and motion.get(s) is not None
                                          and motion.get(s) == motion.get(q.target_state))
                                    for s, q in zip(named, queries, strict=True)])
    out["parsed"] = np.asarray([float(s is not None) for s in named])
    return out


def _ci(x: np.ndarray, videos: np.ndarray, cfg: StudyConfig) -> dict[str, float | None]:
    from distill.faithfulness import cluster_bootstrap

    return cluster_bootstrap(x, np.ones(len(x)), videos, n_resamples=cfg.resamples, seed=0)


def score_budget(cfg: StudyConfig, per_seed: dict[str, list[dict[str, np.ndarray]]], queries: list,
                 majority: str, motion: dict[str, str]) -> dict[str, Any]:
    """Seed-averaged accuracy of each student with its CI, the majority-class floor, and the paired differences."""
    from distill.answers import video_bootstrap

    videos = np.asarray([q.video_id for q in queries])
    reads = [r for r in READS if all(r in h for hs in per_seed.values() for h in hs)]
    mean = {v: {r: np.mean([h[r] for h in hs], axis=0) for r in (*reads, "parsed")} for v, hs in per_seed.items()}
    students = {v: {"name": VARIANT_NAMES[v], "seeds": len(per_seed[v]),
                    "parsed": round(float(mean[v]["parsed"].mean()), 4),
                    **{r: _ci(mean[v][r], videos, cfg) for r in reads},
                    "per_seed": {r: [round(float(h[r].mean()), 4) for h in per_seed[v]] for r in reads}}
                for v in per_seed}
    maj = {"exact": np.asarray([float(q.target_state == majority) for q in queries])}
    if "motion" in reads:
        maj["motion"] = np.asarray([float(motion.get(q.target_state) == motion.get(majority)) for q in queries])
    pairs = []
    for a, b in PAIRS:
        if a in mean and b in mean:
            for r in reads:
                bs = video_bootstrap(mean[a][r], mean[b][r], videos, n_resamples=cfg.resamples, seed=0)
                pairs.append({"a": a, "b": b, "read": r, **bs.to_dict()})
    return {"students": students, "majority": {r: _ci(maj[r], videos, cfg) for r in reads}, "pairs": pairs}


# --- the job ---------------------------------------------------------------------------------------------------

def _queries(cfg: StudyConfig, bench) -> list:
    """The scored queries: the predicate file's sets of ``split`` (the closed slice when it holds one), at most
    ``limit`` of them stratified by video, in query-id order."""
    from distill.faithfulness import sample_by_video
    from distill.narrate import read_predicates

    ids = set(bench.query_field("id", cfg.split))
    sets = [ps for ps in read_predicates(cfg.predicates) if ps.query_id in ids]
    if not sets:
        raise InputError(f"{cfg.predicates}: no predicate sets for split {cfg.split!r}")
    qs = sorted((bench.query(ps.query_id) for ps in sets), key=lambda q: q.id)
    return sample_by_video(qs, lambda q: q.video_id, cfg.limit, 0)


def run_study(cfg: StudyConfig) -> dict[str, Any]:
    """Train, predict, score and test faithfulness (module docstring); writes and returns ``study.json``."""
    from distill.answers import phrasing_lookup
    from eval.benchmark import Benchmark
    from eval.io import write_json

    t0, c0 = time.perf_counter(), time.process_time()
    if cfg.num_threads:
        import torch

        torch.set_num_threads(cfg.num_threads)
    bench = Benchmark.load(cfg.data)
    queries = _queries(cfg, bench)
    lookup, motion = phrasing_lookup(bench), motion_classes(bench)
    k, majority = _slice_floor(cfg, bench)
    runs, where = plan_runs(cfg)
    workers = study_workers(cfg)
    # the longest students first, so the processes finish together
    order = sorted(cfg.variants, key=lambda v: -COST_ORDER.index(v) if v in COST_ORDER else 0)
    jobs = [(runs[r], v, s) for r in runs for v in order for s in cfg.seeds]
    trained = dict(zip([(r.name, v, s) for r, v, s in jobs], in_processes(train_student, cfg, jobs, workers),
                       strict=True))
    answers = [(b.name, *where[b.name], v, s) for b in map(Budget.parse, cfg.budgets) for v in order for s in cfg.seeds]
    answered = dict(zip([(b, v, s) for b, _, _, v, s in answers],
                        in_processes(answer_student, cfg, [(*a, trained[(a[1], a[3], a[4])]["base_model"])
                                                           for a in answers], workers), strict=True))
    result: dict[str, Any] = {"n": len(queries), "videos": len({q.video_id for q in queries}), "k": k,
                              "chance": 1.0 / k, "majority_state": majority, "budgets": {},
                              "runs": {name: {"flags": list(r.flags), "snapshots": list(r.snapshots)}
                                       for name, r in runs.items()}}
    for text in cfg.budgets:
        budget = Budget.parse(text)
        run, step = where[budget.name]
        per_seed: dict[str, list[dict[str, np.ndarray]]] = {}
        infos: dict[str, list[dict[str, Any]]] = {}
        for variant in cfg.variants:
            for seed in cfg.seeds:
                info = {**trained[(run, variant, seed)], "run": run, "snapshot_step": step}
                if step is not None:
                    info.update(global_step=step, wall_s=None)
                info["predict"] = answered[(budget.name, variant, seed)]
                per_seed.setdefault(variant, []).append(hits(phrase_path(cfg, budget.name, variant, seed), queries,
                                                             lookup, motion))
                infos.setdefault(variant, []).append(info)
        scored = score_budget(cfg, per_seed, queries, majority, motion)
        for v, rs in infos.items():
            scored["students"][v]["runs"] = rs
        if "cot" in cfg.variants:
            scored["faithfulness"] = faithfulness(cfg, budget, run, step)
        result["budgets"][budget.name] = scored
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["cpu_s"] = round(time.process_time() - c0, 1)
    out = Path(cfg.out)
    write_json(out / "study.json", result)
    (out / "study.md").write_text(to_markdown(result), encoding="utf-8")
    return result


#: the students from the cheapest to train and answer (a few words) to the dearest (a rationale)
COST_ORDER = ("answer", "trajectory", "cot")


def study_workers(cfg: StudyConfig) -> int:
    """Processes of the study: ``cfg.workers``, or (0) one per CPU this process may use."""
    from eval.threads import affinity_cpus

    return cfg.workers if cfg.workers > 0 else affinity_cpus()


def phrase_path(cfg: StudyConfig, budget: str, variant: str, seed: int) -> Path:
    return Path(cfg.out) / "phrases" / budget / f"{variant}-s{seed}.jsonl"


def answer_student(cfg: StudyConfig, budget: str, run: str, step: int | None, variant: str, seed: int,
                   base_model: str) -> dict[str, Any]:
    """One student's answers to the scored queries (`predict`, its phrase file under ``phrases/<budget>/``)."""
    from eval.benchmark import Benchmark

    bench = Benchmark.load(cfg.data)
    student = load_student(cfg, run, variant, seed, step)
    backend = serve(student["weights"], student["full"], base_model, device=cfg.device, batch_size=cfg.batch_size)
    try:
        return predict(cfg, backend, _queries(cfg, bench), bench, student, phrase_path(cfg, budget, variant, seed))
    finally:
        backend.close()


def _one_thread_worker() -> None:
    """Pool initializer: the worker's torch (and OpenMP) run one thread, so the processes share the CPUs."""
    import os

    os.environ["OMP_NUM_THREADS"] = "1"


def in_processes(fn, cfg: StudyConfig, jobs: list[tuple], workers: int) -> list[Any]:
    """``[fn(cfg, *job) for job in jobs]``, in ``workers`` spawned processes of one thread each when ``workers > 1``
    (each job writes only its own student's folder or phrase file, so the files are those it writes alone)."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(cfg, *job) for job in jobs]
    from eval.pools import process_pool

    with process_pool(min(workers, len(jobs)), initializer=_one_thread_worker) as pool:
        futures = [pool.submit(fn, cfg, *job) for job in jobs]
        return [f.result() for f in futures]


def load_student(cfg: StudyConfig, run: str, variant: str, seed: int, step: int | None) -> dict[str, Any]:
    """The weights of one student (a run's final weights, or its snapshot at ``step``) and its ``psr_student.json``."""
    from distill.train import STUDENT_INFO, snapshot_dir, student_weights
    from eval.io import read_json

    d = run_dir(cfg, run, variant, seed)
    found = student_weights(snapshot_dir(d, step) if step is not None else d)
    if found is None:
        raise MissingInput(f"{d}: no trained weights{f' at step {step}' if step else ''}")
    weights, full = found
    return {"weights": weights, "full": full, **read_json(weights / STUDENT_INFO)}


def _slice_floor(cfg: StudyConfig, bench) -> tuple[int, str]:
    """(K, the majority state): from the predicate file's closed slice (``predicates.config.json``), else the
    distinct targets of the predicate file and its most frequent train target."""
    from distill.narrate import read_predicates
    from eval.io import read_json

    conf = Path(cfg.predicates).with_name(Path(cfg.predicates).name.removesuffix(".jsonl") + ".config.json")
    sl = (read_json(conf).get("summary") or {}).get("slice") if conf.is_file() else None
    if sl:
        return int(sl["k"]), sl["majority"]
    sets = read_predicates(cfg.predicates)
    train = set(bench.query_field("id", "train"))
    counts = Counter(ps.answer for ps in sets if ps.query_id in train) or Counter(ps.answer for ps in sets)
    return len({ps.answer for ps in sets}), min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def faithfulness(cfg: StudyConfig, budget: Budget, run: str, step: int | None) -> dict[str, Any]:
    """The faithfulness check of every seed's CoT student on the same sampled queries, pooled over seeds (each
    seed's records are rows of one table, clustered by video), plus each seed's ``moved``."""
    from distill import faithfulness as F
    from eval.io import write_json, write_jsonl

    records, per_seed, setup, t0, c0 = [], [], None, time.perf_counter(), time.process_time()
    for seed in cfg.seeds:
        student = load_student(cfg, run, "cot", seed, step)
        weights, full, base = student["weights"], student["full"], student["base_model"]
        fc = F.FaithfulnessConfig(data=cfg.data, model=str(weights) if full else base,
                                  adapter=None if full else str(weights), predicates=cfg.predicates,
                                  out=str(Path(cfg.out) / "faithfulness" / budget.name), split=cfg.split,
                                  limit=cfg.faithfulness_limit, max_new_tokens=cfg.faithfulness_max_new_tokens,
                                  batch_size=max(1, cfg.batch_size // 4), device=cfg.device, seed=0,
                                  resamples=cfg.resamples,
                                  progress=cfg.progress)
        fc = F.resolve_preprocessing(fc)
        setup = setup or F.prepare(fc)
        backend = F._student(fc)
        try:
            rs = F.evaluate(setup, fc, backend)
        finally:
            backend.close()
        records += [{**r, "seed": seed} for r in rs]
        per_seed.append(round(float(np.mean([r["moved"] for r in rs])), 4))
    summary = F.summarize(records, n_resamples=cfg.resamples, seed=0, chance=setup.chance)
    summary["counts"] = F.counts(setup, records)
    summary["moved_per_seed"] = per_seed
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    summary["cpu_s"] = round(time.process_time() - c0, 1)
    out = Path(cfg.out) / "faithfulness" / budget.name
    write_jsonl(out / "faithfulness.jsonl", records)
    write_json(out / "faithfulness.json", summary)
    (out / "faithfulness.md").write_text(F.to_markdown(summary), encoding="utf-8")
    return summary


# --- report ----------------------------------------------------------------------------------------------------

def _seconds(runs: list[dict[str, Any]], wall, cpu) -> str:
    """Wall seconds summed over a student's seeds, with the CPU seconds in parentheses where recorded."""
    w = sum(wall(r) or 0 for r in runs)
    c = [cpu(r) for r in runs]
    return f"{w:.0f}" + (f" ({sum(c):.0f})" if all(x is not None for x in c) else "")


def _train_seconds(runs: list[dict[str, Any]]) -> str:
    """Training seconds of a student over its seeds ("in the epochs run" for a nested snapshot)."""
    if any(r.get("snapshot_step") is not None for r in runs):
        return f"in {runs[0]['run']}"
    return _seconds(runs, lambda r: r.get("wall_s"), lambda r: r.get("cpu_s"))


def pct(r: dict | None) -> str:
    """``{value, ci_low, ci_high}`` as ``12.3 [8.1, 16.0]`` (percent)."""
    if not r or r.get("value") is None:
        return "–"
    return f"{100 * r['value']:.1f} [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}]"


def delta(p: dict) -> str:
    return f"{100 * p['delta']:+.1f} [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}]"


def to_markdown(result: dict[str, Any]) -> str:
    """The students table per budget (accuracy with CIs, floors, seconds), the paired differences and faithfulness."""
    lines = [f"{result['n']} test queries from {result['videos']} videos, K = {result['k']} answers (chance "
             f"{100 * result['chance']:.1f}%); accuracy in % with 95% CI (bootstrap over videos) of the hits "
             f"averaged over seeds.", ""]
    for name, b in result["budgets"].items():
        reads = [r for r in READS if r in b["majority"]]
        lines += [f"**Budget {name}**", "",
                  "| student | seeds | steps | supervised tokens | parsed % | " + " | ".join(f"{r} %" for r in reads)
                  + " | train s (CPU s) | predict s (CPU s) |", "|---" * (7 + len(reads)) + "|"]
        lines.append("| majority class | – | – | – | – | " + " | ".join(pct(b["majority"][r]) for r in reads)
                     + " | – | – |")
        for s in b["students"].values():
            runs = s.get("runs", [])
            steps = sorted({r["global_step"] for r in runs})
            lines.append(f"| {s['name']} | {s['seeds']} | {'/'.join(map(str, steps))} | "
                         f"{runs[0].get('supervised_tokens') if runs else '–'} | {100 * s['parsed']:.1f} | "
                         + " | ".join(pct(s[r]) for r in reads)
                         + f" | {_train_seconds(runs)} | "
                         f"{_seconds(runs, lambda r: r['predict'].get('seconds'), lambda r: r['predict'].get('cpu_s'))} |")
        lines += ["", "| difference | read | Δ % [95% CI, paired bootstrap over videos] | p |", "|---|---|---|---|"]
        for p in b["pairs"]:
            pv = "–" if p.get("p_value") is None else f"{p['p_value']:.3g}"
            lines.append(f"| {VARIANT_NAMES[p['a']]} − {VARIANT_NAMES[p['b']]} | {p['read']} | {delta(p)} | {pv} |")
        f = b.get("faithfulness")
        if f:
            cpu = f" ({f['cpu_s']:.0f} CPU s)" if f.get("cpu_s") is not None else ""
            lines += ["", f"Faithfulness of the CoT students ({f['n']} rows: {f['queries']} queries x "
                          f"{len(f['moved_per_seed'])} seeds, {f['videos']} videos; {f['seconds']:.0f} s{cpu}):", "",
                      "| moved | shuffled-body floor | moved − floor | chance 1/K | moved given gold | gold acc | "
                      "changed to another answer |", "|---|---|---|---|---|---|---|",
                      f"| {pct(f['moved'])} | {pct(f.get('moved_shuffled'))} | "
                      f"{pct(f.get('moved_minus_shuffled'))} | {100 * f['chance']:.1f} | "
                      f"{pct(f['moved_given_gold'])} | {pct(f['gold_acc'])} | {pct(f['changed_other'])} |"]
        lines.append("")
    return "\n".join(lines)
