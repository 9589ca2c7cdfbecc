"""The batch runner: one forecaster over a benchmark split, one phrase-file line per query, crash-safe and resumable.

``python -m forecasters run --data DIR --split test --forecaster m3 --backend vllm --model m3 --out runs/m3.jsonl``

Steps (`run`):

1. select the queries: split (``--split``), fair subset, question types, then the shard (``--shard i/n``: the queries
   whose prefix id hashes to ``i``, ``int(sha1(prefix_id)[:8], 16) % n``, so a prefix never spans shards), sorted by
   ``(prefix_id, query id)`` so the frames of a prefix load once and vLLM's prefix cache is reused; ``--limit N``
   keeps the first N;
2. resume (`forecasters.phrasefile`): skip queries already in ``--out`` with the same config hash, redo failed ones
   with ``--redo-failed``;
3. write the resolved config to ``<out stem>.config.json``;
4. generate chunk by chunk (``batch_size`` requests for in-process engines, ``4 x concurrency`` for ``openai``),
   parse each output, append the chunk's lines (whole lines, fsynced), update the progress bar (throughput, ETA,
   failures, tokens/s);
5. stop early, with everything written so far kept, after ``max_consecutive_failures`` transient failures in a row
   (a dead server): rerun with ``--redo-failed`` when it is back;
6. write ``<out stem>.summary.json`` (ok, failed, parse failures, tokens/s, wall time) and return it.

The config hash (`RunIdentity`) covers what changes outputs: forecaster, prompt id + hash, model, adapter (with a
hash of its files), backend, decoding (temperature, max_tokens, top_p, samples, seed), frames, media mode, pixel
caps, system prompt and the benchmark's name and version. It does not cover throughput settings (batch size,
concurrency, timeouts), the shard or ``--limit``, so shards of one run merge, and a run resumes with other settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prompts
from eval.io import write_json
from eval.phrases import PhraseRecord
from forecasters import phrasefile
from forecasters.backends import BackendConfig, Completion, Request, RetryPolicy, SamplingParams, get_backend
from forecasters.backends.base import VideoPart
from forecasters.media import FrameCache, subsample
from forecasters.presets import PRESETS, VLLM_DEFAULTS, resolve_model
from forecasters.registry import ForecasterSpec, get_forecaster

log = logging.getLogger(__name__)

#: error kinds that mean "the server / network is in trouble" (counted for the early stop)
TRANSIENT_KINDS = ("timeout", "connection", "http_429", "http_500", "http_502", "http_503", "http_504")


@dataclass
class RunConfig:
    """A forecaster run. Paths are strings so the config serialises as is; ``model=None`` takes the forecaster's
    default preset. See ``python -m forecasters run --help`` for every field."""

    data: str
    out: str
    forecaster: str = "m3"
    backend: str = "hf"
    model: str | None = None
    adapter: str | None = None
    prompt: str | None = None
    split: str | None = "test"
    fair_only: bool = False
    qtypes: list[str] | None = None
    shard: str = "0/1"
    limit: int | None = None
    samples: int = 1
    temperature: float = 0.0
    max_tokens: int | None = None
    top_p: float = 1.0
    seed: int = 0
    frames: int | None = None
    max_pixels: int | None = None
    min_pixels: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    batch_size: int | None = None
    concurrency: int = 8
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_attempts: int = 6
    wait_initial: float = 1.0
    wait_max: float = 60.0
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool | None = None
    max_lora_rank: int = 16
    trust_remote_code: bool = False
    redo_failed: bool = False
    overwrite: bool = False
    max_consecutive_failures: int = 100
    num_threads: int | None = None
    progress: bool = True

    @property
    def out_path(self) -> Path:
        return Path(self.out)

    def sidecar(self, kind: str) -> Path:
        """``runs/m3.jsonl`` -> ``runs/m3.<kind>.json``."""
        p = self.out_path
        return p.with_name(p.name.removesuffix(".jsonl") + f".{kind}.json")

    def shard_spec(self) -> tuple[int, int]:
        try:
            i, n = (int(x) for x in self.shard.split("/"))
        except ValueError:
            raise ValueError(f"--shard must look like i/n (0 <= i < n), got {self.shard!r}") from None
        if not 0 <= i < n:
            raise ValueError(f"--shard {self.shard}: need 0 <= i < n")
        return i, n

    def default_batch_size(self) -> int:
        if self.batch_size:
            return self.batch_size
        return {"hf": 8, "vllm": 256}.get(self.backend, 4 * max(1, self.concurrency))


def shard_of(prefix_id: str, n: int) -> int:
    """The shard (0..n-1) of a prefix: ``int(sha1(prefix_id)[:8], 16) % n``."""
    return int(hashlib.sha1(prefix_id.encode("utf-8")).hexdigest()[:8], 16) % n


def _hash_files(path: str) -> str | None:
    """sha256 (16 hex) over the regular files of an adapter directory (names and bytes), None if not local."""
    p = Path(path)
    if not p.exists():
        return None
    files = sorted(f for f in (p.rglob("*") if p.is_dir() else [p]) if f.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


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
    frames: int | None
    media_as: str
    max_pixels: int | None
    min_pixels: int | None
    system: str | None
    benchmark: dict

    @property
    def config_hash(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@dataclass
class RunSummary:
    out: str
    config_hash: str
    selected: int = 0
    skipped_done: int = 0
    attempted: int = 0
    ok: int = 0
    failed: int = 0
    parse_failures: int = 0
    length_flags: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_s: float = 0.0
    wall_s: float = 0.0
    frames_loaded: int = 0
    aborted: str | None = None
    engine: str = ""
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.generation_s if self.generation_s > 0 else 0.0

    @property
    def queries_per_s(self) -> float:
        return self.attempted / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(tokens_per_s=round(self.tokens_per_s, 2), queries_per_s=round(self.queries_per_s, 3))
        return d


@dataclass
class Plan:
    """Everything decided before generation: the spec, template, identity and the queries to run."""

    cfg: RunConfig
    spec: ForecasterSpec
    template: prompts.Template
    model: str
    identity: RunIdentity
    sampling: SamplingParams
    selected: list
    todo: list
    existing: phrasefile.ExistingOutput
    bench: Any


def _decoding(cfg: RunConfig, spec: ForecasterSpec) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens or spec.max_tokens, top_p=cfg.top_p,
                          n=cfg.samples, seed=cfg.seed)


def select_queries(bench, cfg: RunConfig) -> list:
    """The queries of this run, in processing order (see the module docstring, step 1)."""
    i, n = cfg.shard_spec()
    qs = bench.queries(cfg.split, fair_only=cfg.fair_only, qtypes=cfg.qtypes)
    qs = [q for q in qs if n == 1 or shard_of(q.prefix_id, n) == i]
    qs.sort(key=lambda q: (q.prefix_id, q.id))
    return qs[: cfg.limit] if cfg.limit is not None else qs


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
    model_name = cfg.model or spec.default_model
    model = resolve_model(model_name)
    sampling = _decoding(cfg, spec)
    bench = Benchmark.load(cfg.data)
    identity = RunIdentity(
        forecaster=spec.name, prompt_id=template.id, prompt_hash=template.hash, model=model, adapter=cfg.adapter,
        adapter_hash=_hash_files(cfg.adapter) if cfg.adapter and cfg.backend != "openai" else None,
        backend=cfg.backend, decoding=sampling.to_dict(), frames=cfg.frames, media_as=spec.media_as,
        max_pixels=cfg.max_pixels, min_pixels=cfg.min_pixels, system=spec.system,
        benchmark={"name": bench.manifest.name, "version": bench.manifest.version})
    selected = select_queries(bench, cfg)
    existing = phrasefile.scan(cfg.out_path)
    other = {h: c for h, c in existing.config_hashes.items() if h != identity.config_hash}
    if other and not cfg.overwrite:
        raise ValueError(f"{cfg.out}: holds {sum(other.values())} line(s) of another config ({sorted(other)}; this run "
                         f"is {identity.config_hash}); write to a new --out, or pass --overwrite to replace the file")
    done = set() if cfg.overwrite else existing.done_ids(identity.config_hash, redo_failed=cfg.redo_failed)
    todo = [q for q in selected if q.id not in done]
    return Plan(cfg=cfg, spec=spec, template=template, model=model, identity=identity, sampling=sampling,
                selected=selected, todo=todo, existing=existing, bench=bench)


def _prepare_output(p: Plan) -> None:
    """Repair / compact / reset the output file before appending (see `forecasters.phrasefile`)."""
    cfg, ex = p.cfg, p.existing
    path = cfg.out_path
    if cfg.overwrite:
        if path.exists():
            phrasefile.rewrite(path, [])
        return
    needs_compaction = ex.duplicates or (cfg.redo_failed and any(phrasefile.record_failed(d) for d in ex.last.values()))
    if needs_compaction:
        redo = {q.id for q in p.todo}
        kept = [d for q, d in ex.last.items() if q not in redo]
        phrasefile.rewrite(path, kept)  # drops the torn tail as well
        log.info("%s: compacted to %d line(s)", path, len(kept))
    elif ex.torn_tail:
        removed = phrasefile.cut_torn_tail(path)
        log.warning("%s: removed a torn last line (%d bytes) left by a crash", path, removed)


def backend_config(cfg: RunConfig, model: str) -> BackendConfig:
    """The backend's config: CLI values, else the preset's vLLM defaults, else the backend defaults."""
    preset = VLLM_DEFAULTS.get(cfg.model or "", {}) if cfg.backend == "vllm" else {}

    def pick(name, default):
        v = getattr(cfg, name)
        return v if v is not None else preset.get(name, default)

    return BackendConfig(
        model=model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device, trust_remote_code=cfg.trust_remote_code,
        max_pixels=pick("max_pixels", None), min_pixels=cfg.min_pixels, max_images=max(8, cfg.frames or 8),
        tensor_parallel_size=pick("tensor_parallel_size", 1), max_model_len=pick("max_model_len", None),
        gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
        max_lora_rank=cfg.max_lora_rank, batch_size=cfg.default_batch_size(), concurrency=cfg.concurrency,
        base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env), timeout_s=cfg.timeout_s,
        retry=RetryPolicy(max_attempts=cfg.max_attempts, wait_initial=cfg.wait_initial, wait_max=cfg.wait_max),
        seed=cfg.seed, num_threads=cfg.num_threads)


def render_request(spec: ForecasterSpec, template: prompts.Template, query, bench, frames: FrameCache, *,
                   sampling: SamplingParams, n_frames: int | None = None) -> Request:
    """Render a forecaster's prompt for one query into a backend `Request` (media from the frame cache)."""
    inp = spec.build(query, bench)
    parts = []
    for part in template.render_parts(inp.values, media=tuple(inp.media)):
        if isinstance(part, str):
            parts.append(part)
            continue
        imgs = frames.get_many(subsample(inp.media[part.name], n_frames))
        if spec.media_as == "video":
            parts.append(VideoPart(tuple(imgs)))
        else:
            parts.extend(imgs)
    return Request(id=query.id, parts=tuple(parts), sampling=sampling, system=spec.system)


def build_request(p: Plan, query, frames: FrameCache) -> Request:
    return render_request(p.spec, p.template, query, p.bench, frames, sampling=p.sampling, n_frames=p.cfg.frames)


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


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "vllm", "peft", "openai"):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, "__version__"):
            out[mod] = m.__version__
    return out


def write_config(p: Plan, engine: str, bcfg: BackendConfig) -> None:
    write_json(p.cfg.sidecar("config"), {
        "run": dataclasses.asdict(p.cfg), "identity": dataclasses.asdict(p.identity),
        "config_hash": p.identity.config_hash, "backend": bcfg.to_dict(), "engine": engine,
        "seed": p.cfg.seed, "batch_size": bcfg.batch_size, "versions": _versions(), "host": platform.node(),
        "selected": len(p.selected), "todo": len(p.todo), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "presets": {k: v for k, v in PRESETS.items() if k == (p.cfg.model or p.spec.default_model)},
    })


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="q", desc="forecast", disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def execute(p: Plan, backend=None) -> RunSummary:
    """Generate the planned queries (building the backend unless one is given) and write their lines."""
    cfg = p.cfg
    t_start = time.perf_counter()
    s = RunSummary(out=cfg.out, config_hash=p.identity.config_hash, selected=len(p.selected),
                   skipped_done=len(p.selected) - len(p.todo))
    bcfg = backend_config(cfg, p.model)
    own_backend = backend is None and bool(p.todo)
    with phrasefile.locked(cfg.out_path):
        _prepare_output(p)
        if own_backend:
            backend = get_backend(cfg.backend, bcfg)
        s.engine = backend.engine_version if backend is not None else ""
        write_config(p, s.engine, bcfg)
        frames = FrameCache(p.bench.root, max_pixels=cfg.max_pixels)
        chunk = bcfg.batch_size
        consecutive = 0
        bar = _progress(len(p.todo), cfg.progress)
        try:
            with phrasefile.PhraseWriter(cfg.out_path) as writer:
                for start in range(0, len(p.todo), chunk):
                    queries = p.todo[start:start + chunk]
                    records, consecutive = _run_chunk(p, backend, queries, frames, s, consecutive, bcfg.batch_size)
                    writer.append(records)
                    bar.update(len(queries))
                    bar.set_postfix(ok=s.ok, failed=s.failed, parse_fail=s.parse_failures,
                                    tok_s=f"{s.tokens_per_s:.0f}", refresh=False)
                    if consecutive >= cfg.max_consecutive_failures:
                        s.aborted = (f"{consecutive} transient failures in a row (server down?); "
                                     "rerun with --redo-failed when it is back")
                        break
        finally:
            bar.close()
            if own_backend:
                backend.close()
        s.frames_loaded = frames.loads
        s.wall_s = time.perf_counter() - t_start
        write_json(cfg.sidecar("summary"), s.to_dict())
    return s


def _run_chunk(p: Plan, backend, queries: Sequence, frames: FrameCache, s: RunSummary, consecutive: int,
               batch_size: int) -> tuple[list[dict], int]:
    reqs: list[Request] = []
    comps: dict[str, Completion] = {}
    for q in queries:
        try:
            reqs.append(build_request(p, q, frames))
        except Exception as e:  # a missing frame or a bad template value: recorded, not fatal
            comps[q.id] = Completion(request_id=q.id, error=f"input: {type(e).__name__}: {e}", error_kind="input")
    t0 = time.perf_counter()
    for c in backend.generate(reqs) if reqs else []:
        comps[c.request_id] = c
    s.generation_s += time.perf_counter() - t0
    records = []
    for q in queries:
        c = comps[q.id]
        rec = to_record(p, q.id, c, engine=s.engine, batch_size=batch_size)
        s.attempted += 1
        s.prompt_tokens += c.prompt_tokens or 0
        s.completion_tokens += c.completion_tokens or 0
        if not c.ok:
            s.failed += 1
            s.error_kinds[c.error_kind or "exception"] = s.error_kinds.get(c.error_kind or "exception", 0) + 1
            consecutive = consecutive + 1 if c.error_kind in TRANSIENT_KINDS else 0
        else:
            consecutive = 0
            if rec.parse_ok:
                s.ok += 1
                s.length_flags += "length" in rec.flags
            else:
                s.parse_failures += 1
        records.append(rec.to_dict())
    return records, consecutive


def run(cfg: RunConfig, backend=None) -> RunSummary:
    """Plan and execute a run; see the module docstring. ``backend`` (optional) reuses an already built backend."""
    return execute(plan(cfg), backend=backend)
