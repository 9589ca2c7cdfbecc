"""The batch runner: one forecaster over a benchmark split, one phrase-file line per query, crash-safe and resumable.

``python -m forecasters run --data DIR --split test --forecaster m3 --backend vllm --model m3 --out runs/m3.jsonl``

Steps (`run`):

1. select the queries: split (``--split``), fair subset, question types, then the shard (``--shard i/n``: the queries
   whose prefix id hashes to ``i``, ``int(sha1(prefix_id)[:8], 16) % n``, so a prefix never spans shards), sorted by
   ``(prefix_id, query id)`` so the frames of a prefix load once and vLLM's prefix cache is reused; ``--limit N``
   keeps the first N;
2. resume (`forecasters.phrasefile`): skip queries already in ``--out`` with the same config hash, redo failed ones
   with ``--redo-failed``; lines of another config stop the job unless ``--drop-foreign`` / ``--overwrite``;
3. check the engine before the first request (`Backend.preflight`: for ``openai``, ``GET /v1/models`` answers and
   lists the model), then write the resolved config to ``<out stem>.config.json``;
4. generate through `Backend.stream` (chunks of ``batch_size`` for in-process engines; for ``openai`` a steady
   ``concurrency`` requests in flight), parse each output and append the lines answered since the last write
   (whole lines, fsynced: `eval.resumable.Appender`) as they arrive; update the progress bar (throughput, ETA,
   failures, tokens/s);
5. stop early, with everything written so far kept (`StopRule`, error classes in `forecasters.backends.base`): at
   the first ``fatal`` error (HTTP 401/403/404: a wrong model, adapter, key or route), after `REJECTED_IN_A_ROW`
   ``rejected`` requests in a row (other 4xx, e.g. vLLM's 400 for too many images or a too large ``max_tokens``),
   after ``max_consecutive_failures`` ``transient`` failures in a row (a dead server; each request was already
   retried), or after `NO_ANSWER_LIMIT` when no request of this invocation has been answered yet (so small jobs
   and shards stop too);
6. write ``<out stem>.summary.json``: the state of the file over the selected queries (ok, parse failures, failed,
   missing, ``complete``; `phrasefile.coverage`) and what this invocation did (attempted, tokens/s, wall time,
   why it stopped), and return it. ``complete`` means every selected query has an answer; the CLI exits non-zero
   (`eval.errors.EXIT_INCOMPLETE`) otherwise, naming the command that finishes the job.

Frames are resized on our side before any backend sees them (the pixel policy of `forecasters.presets`): at most
``--max-pixels`` pixels a frame, by default the forecaster's ``max_pixels``; ``0`` sends full-size frames.
``--frames`` picks which prefix frames a request carries (`forecasters.media.FrameSelection`: ``all``, ``last``,
the ``K`` last, ``spaced:K``), for every image forecaster; it is part of the config hash (None for ``all``).

What the forecaster does with the queries is its `Task`: `GenerateTask` (generate and parse phrases) or, for a
scoring forecaster (``likelihood``), `forecasters.likelihood_run.ScoreTask` (score candidate states; its lines carry
the candidates' scores, and when every selected query is answered it also writes the run file). Both go through the
same steps.

The config hash (`RunIdentity`) covers what changes outputs: forecaster, prompt id + hash, model, adapter (with a
hash of its files), backend, decoding (temperature, max_tokens, top_p, samples, seed), frames, media mode, the pixel
cap applied, min pixels, system prompt and the benchmark's name and version; for a scoring forecaster also the
candidates (their source and a hash of it) and the normalization. It does not cover throughput settings
(batch size, concurrency, timeouts), the shard or ``--limit``, so shards of one run merge, and a run resumes with
other settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import prompts
from eval import resumable
from eval.environment import loaded_versions
from eval.errors import IncompleteJob, InputError
from eval.fingerprint import sha256_tree
from eval.io import write_json, write_jsonl
from eval.phrases import PhraseRecord
from eval.schema import PREFIX_FRAMES
from forecasters import phrasefile
from forecasters.backends import (
    BackendConfig,
    Completion,
    Request,
    RetryPolicy,
    SamplingParams,
    config_for,
    error_class,
    get_backend,
)
from forecasters.likelihood_run import ScoreTask
from forecasters.media import FrameCache, FrameSelection
from forecasters.presets import PRESETS, VLLM_DEFAULTS, resolve_model
from forecasters.prompting import render_request
from forecasters.registry import ForecasterSpec, get_forecaster
from forecasters.run_config import RunConfig

log = logging.getLogger(__name__)

#: ``rejected`` requests (non-retryable 4xx, unsupported input) in a row that stop a job
REJECTED_IN_A_ROW = 5
#: failed requests (transient or rejected) that stop a job when none of this invocation has been answered yet
NO_ANSWER_LIMIT = 8
#: libraries whose versions the run config records (those imported by the run)
RECORDED_LIBRARIES = ("torch", "transformers", "vllm", "peft", "httpx")


def shard_of(prefix_id: str, n: int) -> int:
    """The shard (0..n-1) of a prefix: ``int(sha1(prefix_id)[:8], 16) % n``."""
    return int(hashlib.sha1(prefix_id.encode("utf-8")).hexdigest()[:8], 16) % n


def adapter_hash(path: str) -> str | None:
    """`eval.fingerprint.sha256_tree` of an adapter (16 hex digits; names and bytes of its files), None if not
    local."""
    h = sha256_tree(path)
    return h[:16] if h else None


@dataclass(frozen=True)
class RunIdentity:
    """What the config hash covers (see the module docstring)."""

    forecaster: str
    prompt_id: str
    prompt_hash: str
    model: str
    adapter: str | None
    adapter_hash: str | None
    backend: str
    decoding: dict
    frames: str | None
    media_as: str
    max_pixels: int | None
    min_pixels: int | None
    system: str | None
    benchmark: dict
    scoring: dict | None = None

    @property
    def config_hash(self) -> str:
        d = dataclasses.asdict(self)
        if d["scoring"] is None:
            del d["scoring"]  # a generation run's hash has no "scoring" key (not even null)
        blob = json.dumps(d, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@dataclass
class RunSummary:
    """What the output file holds for the selected queries, and what this invocation did.

    The file: ``coverage`` (`phrasefile.Coverage` over the selected queries: ok, parse failures, failed, missing,
    length flags, failed lines by kind). ``complete``: every selected query is answered (ok or parse failure). This
    invocation: ``skipped_done`` (selected queries already done), ``attempted``, ``attempted_failed``, token counts,
    generation and wall time, ``aborted`` (why it stopped early, or None).
    """

    out: str
    config_hash: str
    coverage: phrasefile.Coverage = field(default_factory=phrasefile.Coverage)
    skipped_done: int = 0
    attempted: int = 0
    attempted_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_s: float = 0.0
    wall_s: float = 0.0
    frames_loaded: int = 0
    largest_frame: tuple[int, int] | None = None
    aborted: str | None = None
    engine: str = ""
    run_file: str | None = None

    @property
    def complete(self) -> bool:
        return self.coverage.complete

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.generation_s if self.generation_s > 0 else 0.0

    @property
    def queries_per_s(self) -> float:
        return self.attempted / self.wall_s if self.wall_s > 0 else 0.0

    def incomplete(self, command: str | None = None) -> IncompleteJob | None:
        """The `IncompleteJob` error saying what is missing and how to finish (None when complete). ``command``:
        the command line that ran, to print the one that finishes."""
        c = self.coverage
        if c.complete:
            return None
        kinds = ", ".join(f"{k} x{v}" for k, v in sorted(c.error_kinds.items(), key=lambda kv: -kv[1]))
        msg = (f"{self.out}: {c.queries - c.answered} of {c.queries} selected queries have no answer ({c.failed} "
               "failed" + (f": {kinds}" if kinds else "") + f", {c.missing} missing)")
        if self.aborted:
            msg += f"; stopped early: {self.aborted}"
        flag = " --redo-failed" if c.failed else ""
        if command:
            cmd = command + (flag if flag.strip() not in command.split() else "")
            fix = f"fix the cause, then run: {cmd}"
        else:
            fix = f"fix the cause, then rerun the same command{flag and ' with' + flag}"
        return IncompleteJob(msg, fix=fix)

    def to_dict(self) -> dict[str, Any]:
        """The summary file: ``out``, ``config_hash``, ``complete``, the coverage (``queries`` named ``selected``)
        and ``this_run`` (this invocation's counts and times)."""
        cov = dataclasses.asdict(self.coverage)
        d = {"out": self.out, "config_hash": self.config_hash, "complete": self.complete,
             "selected": cov.pop("queries"), **cov}
        run = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("out", "config_hash", "coverage")}
        run.update(tokens_per_s=round(self.tokens_per_s, 2), queries_per_s=round(self.queries_per_s, 3))
        d["this_run"] = run
        return d


@dataclass
class StopRule:
    """When a job stops early (see the module docstring, step 5). Feed each completion to `update`; it returns the
    reason to stop, or None. ``answered``: requests of this invocation answered so far."""

    max_transient: int
    answered: int = 0
    streak: int = 0
    rejected_streak: int = 0

    def update(self, c: Completion) -> str | None:
        if c.ok:
            self.answered += 1
            self.streak = self.rejected_streak = 0
            return None
        cls = error_class(c.error_kind)
        if cls == "input":
            return None
        what = f"{c.error_kind}: {(c.error or '')[:200]}"
        if cls == "fatal":
            return f"the server refused a request with {what} (a wrong --model / --adapter, API key or --base-url?)"
        self.streak += 1
        self.rejected_streak = self.rejected_streak + 1 if cls == "rejected" else 0
        if self.rejected_streak >= REJECTED_IN_A_ROW:
            return f"{self.rejected_streak} requests in a row rejected, the last with {what}"
        if self.answered == 0 and self.streak >= min(NO_ANSWER_LIMIT, self.max_transient):
            return f"the first {self.streak} requests all failed, the last with {what}"
        if self.streak >= self.max_transient:
            return f"{self.streak} failures in a row (server down?), the last with {what}"
        return None


@dataclass
class Plan:
    """Everything decided before generation: the spec, template, identity, the selected queries (``(id, row)``
    pairs, in processing order), the typed queries to run (``todo``) and the ``task`` (`GenerateTask`, or
    `forecasters.likelihood_run.ScoreTask` for a scoring forecaster)."""

    cfg: RunConfig
    spec: ForecasterSpec
    template: prompts.Template
    model: str
    identity: RunIdentity
    sampling: SamplingParams
    selected: list[tuple[str, int]]
    todo: list
    existing: phrasefile.ExistingOutput
    bench: Any
    task: Task

    def request(self, query, frames: FrameCache) -> Request:
        """The backend request of one query (`forecasters.prompting.render_request` with the run's frames)."""
        return render_request(self.spec, self.template, query, self.bench, frames, sampling=self.sampling,
                              selection=self.cfg.frame_selection())


class Task(Protocol):
    """What a forecaster does with the planned queries: `GenerateTask` generates phrases,
    `forecasters.likelihood_run.ScoreTask` scores candidate answers. ``decoding`` and ``identity`` enter the config
    hash (`RunIdentity`: ``decoding`` and ``scoring``)."""

    decoding: dict
    identity: dict | None

    def check(self, backend) -> None:
        """Refuse, before anything is written, a backend that cannot do the task."""

    def start(self, p: Plan, backend) -> str | None:
        """Work before the first query; returns why the job stops instead, or None."""

    def stream(self, p: Plan, backend, frames: FrameCache) -> Iterator[list]:
        """The backend's answers to ``p.todo``, in groups as they finish (`Backend.stream`)."""

    def record(self, p: Plan, result, *, engine: str, batch_size: int) -> PhraseRecord:
        """The phrase-file line of one answer."""

    def finish(self, p: Plan) -> Path | None:
        """Work once every selected query is answered; returns the file it wrote, if any."""

    def config(self) -> dict:
        """What the task adds to the run config (``OUT.config.json``)."""


@dataclass(frozen=True)
class GenerateTask:
    """A generating forecaster: each query's request sampled with ``sampling``, each output parsed (`to_record`)."""

    sampling: SamplingParams

    @property
    def decoding(self) -> dict:
        return self.sampling.to_dict()

    @property
    def identity(self) -> None:
        """Nothing: a generation run's config hash has no ``scoring`` part."""
        return None

    def check(self, backend) -> None:
        return None

    def start(self, p: Plan, backend) -> str | None:
        return None

    def stream(self, p: Plan, backend, frames: FrameCache) -> Iterator[list]:
        return backend.stream(_requests(p, frames))

    def record(self, p: Plan, result, *, engine: str, batch_size: int) -> PhraseRecord:
        return to_record(p, result.request_id, result, engine=engine, batch_size=batch_size)

    def finish(self, p: Plan) -> Path | None:
        return None

    def config(self) -> dict:
        return {}


def _decoding(cfg: RunConfig, spec: ForecasterSpec) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens or spec.max_tokens, top_p=cfg.top_p,
                          n=cfg.samples, seed=cfg.seed)


def select_query_rows(bench, cfg: RunConfig) -> list[tuple[str, int]]:
    """``(query id, row)`` of the queries of this run, in processing order (see the module docstring, step 1), from
    the id columns alone: no query record is built here."""
    i, n = cfg.shard_spec()
    rows = bench.selection(cfg.split, fair_only=cfg.fair_only, qtypes=cfg.qtypes, allow_empty=cfg.allow_empty)
    ids, prefixes = bench.queries_ds["id"][:], bench.queries_ds["prefix_id"][:]
    keys = [(prefixes[r], ids[r], int(r)) for r in rows if n == 1 or shard_of(prefixes[r], n) == i]
    keys.sort()
    keys = keys[: cfg.limit] if cfg.limit is not None else keys
    return [(qid, row) for _, qid, row in keys]


def load_queries(bench, rows: Sequence[int]) -> list:
    """The typed queries of benchmark ``rows``, in that order."""
    from eval.schema import Query

    # to_list converts the Arrow rows in one go: ~5x faster than iterating the dataset row by row
    return [Query.from_dict(r) for r in bench.queries_ds.select(list(rows)).to_list()] if len(rows) else []


def select_queries(bench, cfg: RunConfig) -> list:
    """The queries of this run, in processing order (see the module docstring, step 1)."""
    return load_queries(bench, [row for _, row in select_query_rows(bench, cfg)])


#: The record a distilled student's adapter carries (written by ``distill.train``): its training preprocessing.
STUDENT_INFO = "psr_student.json"


def adapter_preprocessing(cfg: RunConfig, template: prompts.Template) -> RunConfig:
    """For an adapter trained by ``distill.train``: take its preprocessing (frames, max / min pixels) where the run
    leaves them unset, and refuse a run that sets another value or renders another prompt (id + hash), so the
    student is served the image tokens and prompt it was trained on."""
    from eval.errors import InputError
    from eval.io import read_json

    info = Path(cfg.adapter) / STUDENT_INFO if cfg.adapter else None
    if info is None or not info.is_file():
        return cfg
    pre = read_json(info).get("preprocessing") or {}
    updates, conflicts = {}, []
    for key in ("frames", "max_pixels", "min_pixels"):
        want, have = pre.get(key), getattr(cfg, key)
        if key == "max_pixels" and key in pre and want is None:
            want = 0  # trained on full-size frames: the runner's "no cap" (None would take the forecaster's cap)
        if key == "frames" and want is not None:  # distill.sft trains on K evenly spaced frames, the last kept
            trained = FrameSelection("spaced", int(want))
            want = str(trained)
            # a spelling that selects the same frames of the prefix (e.g. 8 = last:8 = spaced:8 = all) agrees
            have = None if have is None else (want if cfg.frame_selection().same_frames(trained, PREFIX_FRAMES)
                                              else str(cfg.frame_selection()))
        if want is not None and have is None:
            updates[key] = want
        elif want is not None and have != want:
            conflicts.append(f"--{key.replace('_', '-')} {have} (trained with {want})")
    if pre.get("prompt_hash") and (template.id, template.hash) != (pre.get("prompt_id"), pre["prompt_hash"]):
        conflicts.append(f"prompt {template.id} {template.hash} (trained with {pre.get('prompt_id')} "
                         f"{pre['prompt_hash']})")
    if conflicts:
        raise InputError(f"{cfg.adapter}: the run differs from the adapter's training preprocessing: "
                         + "; ".join(conflicts), fix="leave these options unset to take the adapter's")
    return dataclasses.replace(cfg, **updates) if updates else cfg


def plan(cfg: RunConfig) -> Plan:
    """Resolve the config and decide which queries to run (reads the benchmark and the existing output)."""
    from eval.benchmark import Benchmark

    spec = get_forecaster(cfg.forecaster)
    template = prompts.load(cfg.prompt or spec.prompt)
    cfg = adapter_preprocessing(cfg, template)
    selection = cfg.frame_selection()
    cfg = dataclasses.replace(cfg, frames=str(selection))  # the run config records the canonical spelling
    model_name = cfg.model or spec.default_model
    model = resolve_model(model_name)
    sampling = _decoding(cfg, spec)
    if cfg.backend == "openai" and cfg.min_pixels:
        raise InputError("--min-pixels is a processor setting of the in-process engines (hf, vllm); over HTTP the "
                         "server's processor decides", fix="drop --min-pixels, or use --backend hf / vllm")
    bench = Benchmark.load(cfg.data)
    selected = select_query_rows(bench, cfg)
    task = ScoreTask.setup(cfg, bench, [qid for qid, _ in selected]) if spec.kind == "likelihood" \
        else GenerateTask(sampling)
    identity = RunIdentity(
        forecaster=spec.name, prompt_id=template.id, prompt_hash=template.hash, model=model, adapter=cfg.adapter,
        adapter_hash=adapter_hash(cfg.adapter) if cfg.adapter and cfg.backend != "openai" else None,
        backend=cfg.backend, decoding=task.decoding, frames=selection.key,
        media_as=spec.media_as, max_pixels=cfg.pixel_cap(spec), min_pixels=cfg.min_pixels, system=spec.system,
        benchmark={"name": bench.manifest.name, "version": bench.manifest.version},
        scoring=task.identity)
    existing = phrasefile.scan(cfg.out_path)
    other = {h: c for h, c in existing.config_hashes.items() if h != identity.config_hash}
    if other and not (cfg.overwrite or cfg.drop_foreign):
        mine = existing.config_hashes.get(identity.config_hash, 0)
        raise InputError(f"{cfg.out}: holds {sum(other.values())} line(s) of another config ({sorted(other)}) and "
                         f"{mine} of this run's ({identity.config_hash})",
                         fix="write to a new --out; or pass --drop-foreign to move only the other config's lines to "
                             f"{cfg.out}.foreign and keep this run's; or --overwrite to start the file empty")
    done = set() if cfg.overwrite else existing.done_ids(identity.config_hash, redo_failed=cfg.redo_failed)
    todo = load_queries(bench, [row for qid, row in selected if qid not in done])  # records for the todo only
    return Plan(cfg=cfg, spec=spec, template=template, model=model, identity=identity, sampling=sampling,
                selected=selected, todo=todo, existing=existing, bench=bench, task=task)


def _prepare_output(p: Plan) -> None:
    """Repair / compact / reset the output file before appending (see `forecasters.phrasefile`)."""
    cfg, ex = p.cfg, p.existing
    path = cfg.out_path
    if cfg.overwrite:
        if path.exists():
            write_jsonl(path, [])
        return
    mine = ex.lines_of(p.identity.config_hash)
    foreign = sum(ex.config_hashes.values()) - ex.config_hashes.get(p.identity.config_hash, 0)
    redo = {q.id for q in p.todo}
    if foreign:
        moved, dest = phrasefile.move_foreign_lines(path, p.identity.config_hash)
        log.warning("%s: moved %d line(s) of another config to %s", path, moved, dest)
    if foreign or ex.duplicates or any(q in redo for q in mine):
        kept = [d for q, d in mine.items() if q not in redo]
        write_jsonl(path, kept)  # drops the torn tail as well
        log.info("%s: compacted to %d line(s)", path, len(kept))
    elif ex.torn_tail:
        removed = resumable.cut_torn_tail(path)
        log.warning("%s: removed a torn last line (%d bytes) left by a crash", path, removed)


def backend_config(cfg: RunConfig, model: str) -> BackendConfig:
    """The backend's config (`forecasters.backends.config_for`): run options, else the preset's vLLM defaults,
    else the backend's defaults."""
    preset = VLLM_DEFAULTS.get(cfg.model or "", {}) if cfg.backend == "vllm" else {}

    def pick(name, default):
        v = getattr(cfg, name)
        return v if v is not None else preset.get(name, default)

    return config_for(
        cfg.backend, model=model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device,
        trust_remote_code=cfg.trust_remote_code, max_pixels=cfg.pixel_cap(get_forecaster(cfg.forecaster)),
        min_pixels=cfg.min_pixels, max_images=max(8, cfg.frame_selection().k or 8),
        tensor_parallel_size=pick("tensor_parallel_size", 1), max_model_len=pick("max_model_len", None),
        gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
        max_lora_rank=cfg.max_lora_rank, batch_size=cfg.default_batch_size(), concurrency=cfg.concurrency,
        base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env), timeout_s=cfg.timeout_s,
        retry=RetryPolicy(max_attempts=cfg.max_attempts, wait_initial=cfg.wait_initial, wait_max=cfg.wait_max),
        seed=cfg.seed, num_threads=cfg.num_threads, candidate_batch_size=cfg.candidate_batch_size)


def to_record(p: Plan, query_id: str, comp: Completion, *, engine: str, batch_size: int) -> PhraseRecord:
    """The phrase-file line of one completion: parsed phrase(s), raw output, provenance and diagnostics."""
    rec = PhraseRecord(query_id=query_id, model=p.model, backend=p.cfg.backend, forecaster=p.spec.name,
                       prompt_id=p.template.id, prompt_hash=p.template.hash, decoding=p.sampling.to_dict(),
                       config_hash=p.identity.config_hash)
    rec.extra.update(engine=engine, batch_size=batch_size, seed=p.cfg.seed, attempts=comp.attempts,
                     latency_s=round(comp.latency_s, 4), prompt_tokens=comp.prompt_tokens,
                     completion_tokens=comp.completion_tokens)
    if p.cfg.adapter:
        rec.extra["adapter"] = p.cfg.adapter
    if not comp.ok:
        rec.error, rec.parse_ok = comp.error, False
        rec.extra["error_kind"] = comp.error_kind
        return rec
    parsed = [p.spec.parse(t) for t in comp.texts]
    rec.raw = comp.texts[0] if len(comp.texts) == 1 else list(comp.texts)
    rec.phrases = [x.phrase for x in parsed if x.ok]
    rec.phrase = rec.phrases[0] if rec.phrases else None
    rec.parse_ok = bool(rec.phrases)
    flags = {f for x in parsed for f in x.flags}
    if "length" in comp.finish_reasons:
        flags.add("truncated")
    rec.flags = sorted(flags)
    rec.extra["finish_reasons"] = comp.finish_reasons
    return rec


def write_config(p: Plan, engine: str, bcfg: BackendConfig) -> None:
    write_json(p.cfg.sidecar("config"), {
        "run": dataclasses.asdict(p.cfg), "identity": dataclasses.asdict(p.identity),
        "config_hash": p.identity.config_hash, "backend": bcfg.to_dict(), "engine": engine,
        "seed": p.cfg.seed, "batch_size": bcfg.batch_size, "versions": loaded_versions(RECORDED_LIBRARIES), "host": platform.node(),
        "selected": len(p.selected), "todo": len(p.todo), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "presets": {k: v for k, v in PRESETS.items() if k == (p.cfg.model or p.spec.default_model)},
        **p.task.config(),
    })


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="q", desc="forecast", disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def execute(p: Plan, backend=None) -> RunSummary:
    """Generate the planned queries (building the backend unless one is given) and write their lines."""
    cfg = p.cfg
    t_start = time.perf_counter()
    s = RunSummary(out=cfg.out, config_hash=p.identity.config_hash, skipped_done=len(p.selected) - len(p.todo))
    bcfg = backend_config(cfg, p.model)
    own_backend = backend is None and bool(p.todo)
    with resumable.locked(cfg.out_path):
        try:
            if own_backend:
                backend = get_backend(cfg.backend, bcfg)
            if p.todo:
                backend.preflight()  # before anything is written: a dead server or a wrong model name stops here
                p.task.check(backend)
            _prepare_output(p)
            s.engine = backend.engine_version if backend is not None else ""
            write_config(p, s.engine, bcfg)
            frames = FrameCache(p.bench.root, max_pixels=bcfg.max_pixels)
            try:
                if p.todo:
                    _generate(p, backend, frames, s)
            except BaseException as e:  # Ctrl-C, a crash: the summary still says what the file holds
                s.aborted = s.aborted or f"interrupted ({type(e).__name__})"
                raise
            finally:
                s.frames_loaded, s.largest_frame = frames.loads, frames.largest
                s.coverage = phrasefile.coverage(phrasefile.scan(cfg.out_path).lines_of(s.config_hash),
                                                 [qid for qid, _ in p.selected])
                s.wall_s = time.perf_counter() - t_start
                write_json(cfg.sidecar("summary"), s.to_dict())
            written = p.task.finish(p) if s.complete else None
            if written is not None:
                s.run_file = str(written)
                write_json(cfg.sidecar("summary"), s.to_dict())
        finally:
            if own_backend and backend is not None:
                backend.close()
    return s


def _requests(p: Plan, frames: FrameCache) -> Iterator[Request | Completion]:
    """The todo queries as requests, built lazily; a query whose request cannot be built (a missing frame, a bad
    template value) becomes an ``input`` failure, recorded and not fatal."""
    for q in p.todo:
        try:
            yield p.request(q, frames)
        except Exception as e:
            yield Completion(request_id=q.id, error=f"input: {type(e).__name__}: {e}", error_kind="input")


def _generate(p: Plan, backend, frames: FrameCache, s: RunSummary) -> None:
    """Stream the todo queries through the backend; append each group of answered lines as it arrives."""
    cfg = p.cfg
    rule = StopRule(max_transient=cfg.max_consecutive_failures)
    batch_size = backend.config.batch_size if hasattr(backend, "config") else cfg.default_batch_size()
    stopped = p.task.start(p, backend)
    if stopped:
        s.aborted = stopped
        log.warning("stopping: %s", stopped)
        return
    stream = p.task.stream(p, backend, frames)
    bar = _progress(len(p.todo), cfg.progress)
    t0 = time.perf_counter()
    try:
        with resumable.Appender(cfg.out_path) as writer:
            for comps in stream:
                records = []
                for c in comps:
                    records.append(p.task.record(p, c, engine=s.engine, batch_size=batch_size).to_dict())
                    s.attempted += 1
                    s.attempted_failed += not c.ok
                    s.prompt_tokens += c.prompt_tokens or 0
                    s.completion_tokens += getattr(c, "completion_tokens", 0) or 0
                    s.aborted = s.aborted or rule.update(c)
                writer.append(records)
                s.generation_s = time.perf_counter() - t0
                bar.update(len(comps))
                bar.set_postfix(failed=s.attempted_failed, tok_s=f"{s.tokens_per_s:.0f}", refresh=False)
                if s.aborted:
                    log.warning("stopping early: %s", s.aborted)
                    break
    finally:
        stream.close()  # abandons the requests still in flight (their queries stay missing: a rerun does them)
        bar.close()


def run(cfg: RunConfig, backend=None) -> RunSummary:
    """Plan and execute a run; see the module docstring. ``backend`` (optional) reuses an already built backend."""
    return execute(plan(cfg), backend=backend)
