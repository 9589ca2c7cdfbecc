"""Narration: predicates -> a chain-of-thought rationale that ends in ``Answer: <state phrase>``.

Two narrators, both recorded in every output line (``narrator``):

- ``teacher`` (DynaPix §5.1: Qwen3-32B at temperature 0.7): the ``teacher_narration`` prompt (`prompts`, id + hash
  recorded) with the query's predicates, one per line, goes to a text model through any `forecasters` backend
  (``vllm`` in process, ``openai`` for a served model, ``hf`` for small local models). Each output is validated
  (`distill.validator`); rejected ones are resampled with a new seed, at most ``max_tries`` times per query. Every
  rejected try is logged with its reasons; a query that exhausts its tries becomes a failure record.
  ``<think>...</think>`` blocks are dropped before validation; with ``no_think`` the user turn ends in ``/no_think``
  (Qwen3's switch for answering without a thinking block).
- ``template`` (deterministic, for offline use and tests; labelled ``narrator: "template"``): the predicates
  arranged as scene parsing, motion analysis and prediction paragraphs, with fixed connective sentences, padded to
  at least the validator's minimum length. It uses nothing but the predicates, so it is as grounded as the teacher's
  input, but its wording is fixed.

An accepted rationale is stored with its answer line normalised to the canonical target state (the teacher may
answer with a listed synonym), so SFT targets and the student parser agree.

Job (``python -m distill narrate``), resumable: ``<out>/rationales.jsonl`` (accepted), ``<out>/rejects.jsonl``
(every rejected try: query id, try, text, reasons), ``<out>/failures.jsonl`` (queries that exhausted their tries),
``<out>/narrate.config.json`` (resolved config, prompt id/hash, engine) and ``<out>/narrate.summary.json``. A rerun
skips queries already accepted or failed (``redo_failed`` retries the failures); lines of another config are refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distill.predicates import PredicateSet
from distill.validator import RationaleValidator, Verdict, split_answer

log = logging.getLogger(__name__)

TEMPLATE_NARRATOR = "template"
TEACHER_NARRATOR = "teacher"
TEMPLATE_VERSION = "template-v1"
DEFAULT_TEACHER = "Qwen/Qwen3-32B"
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)


# --- the deterministic template narrator -------------------------------------------------------------------

_DOMAIN_INTRO = {
    "ramp": "The frames show a ramp that leads down onto a table, with objects on and around it.",
    "table_push": "The frames show objects standing in a row on a table, with a flat pusher at one end of it.",
    "dominoes": "The frames show a small ramp and, further along, a row of standing dominoes.",
    "container": "The frames show an open container on the floor and objects being released from above it.",
}
_OPENERS = ("Let me first look at the scene.", "First, what the frames show.", "I start by parsing the scene.")
_MOTION_OPENERS = ("Next, the motion.", "Now I analyse how things move.", "Then I look at the motion.")
_PREDICT_OPENERS = ("Putting this together:", "From this I can predict what happens:", "So the prediction is this:")
_PADDING = (
    "The question asks about the {subject}, so I keep my attention on it and on what surrounds it.",
    "What matters is how it moves at the end of the clip and what will act on it after that.",
    "Nothing in the frames points to a different course of events than the one described here.",
    "Each step follows from the one before it, so the sequence should play out in this order.",
    "I do not need exact distances or times for this; the qualitative picture is enough.",
)
#: facts dropped first (in this order) when a template rationale would exceed the word limit
_DROP_ORDER = ("scene_objects", "relative_speed", "speed_trend", "edge", "container", "time_to_target",
               "support_now", "collision_course", "other_end_state", "direction")


def _pick(options: Sequence[str], key: str, salt: int) -> str:
    return options[(zlib.crc32(key.encode()) + salt) % len(options)]


def _paragraphs(ps: PredicateSet, drop: set[str], padding: int) -> tuple[str, str, str]:
    facts = [f for f in ps.facts if f.kind not in drop]
    intro = _DOMAIN_INTRO.get(ps.domain, f"The frames show the {ps.subject} in a scene of the {ps.domain} kind.")
    scene = [_pick(_OPENERS, ps.query_id, 0), intro] + [f.text for f in facts if f.section == "scene"]
    motion = [_pick(_MOTION_OPENERS, ps.query_id, 1)] + [f.text for f in facts if f.section == "motion"]
    pred = [f.text for f in facts if f.section == "prediction"]
    pad = [p.format(subject=ps.subject) for p in _PADDING[:padding]]
    # padding goes between the analysis and the prediction, never after the conclusion
    motion += pad
    return " ".join(scene), " ".join(motion), " ".join([_pick(_PREDICT_OPENERS, ps.query_id, 2), *pred])


def template_rationale(ps: PredicateSet, *, min_words: int = 80, max_words: int = 250) -> str:
    """The deterministic rationale of one query: scene, motion and prediction paragraphs, then the answer line.

    Connective sentences are added (at most ``len(_PADDING)``) until the body has ``min_words`` words; facts of
    `_DROP_ORDER` kinds are dropped while it exceeds ``max_words``.
    """
    from distill.validator import count_words

    drop: set[str] = set()
    padding = 0
    while True:
        body = "\n\n".join(_paragraphs(ps, drop, padding))
        n = count_words(body)
        if n < min_words and padding < len(_PADDING):
            padding += 1
            continue
        if n > max_words:
            nxt = next((k for k in _DROP_ORDER if k not in drop and ps.fact(k) is not None), None)
            if nxt is not None:
                drop.add(nxt)
                padding = 0
                continue
        return f"{body}\nAnswer: {ps.answer}"


# --- results -----------------------------------------------------------------------------------------------

@dataclass
class NarrationResult:
    """The outcome of narrating one query: the accepted ``rationale`` (None on failure) and every try's verdict."""

    query_id: str
    ok: bool
    rationale: str | None
    narrator: str
    model: str | None
    tries: int
    reasons: list[str] = field(default_factory=list)  # one summary per rejected try
    words: int = 0
    seeds: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalise_answer(text: str, answer: str) -> str:
    """The rationale's body followed by exactly one answer line naming the canonical state."""
    body, _ = split_answer(text)
    return f"{body}\nAnswer: {answer}"


def strip_thinking(text: str) -> str:
    return _THINK.sub("", text or "").strip()


# --- the teacher -------------------------------------------------------------------------------------------

class TeacherNarrator:
    """Teacher narration through a `forecasters` backend with validation and bounded resampling.

    ``generate(requests)`` is the backend's; ``on_reject(query_id, try, text, verdict)`` is called for each rejected
    try (the job logs it). Seeds: try ``t`` (0-based) of every query samples with ``seed + t``.
    """

    def __init__(self, backend, validator: RationaleValidator, *, template_id: str = "teacher_narration",
                 temperature: float = 0.7, max_tokens: int = 1024, top_p: float = 1.0, max_tries: int = 4,
                 seed: int = 0, no_think: bool = True, model: str | None = None, on_reject=None):
        import prompts

        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        self.backend, self.validator = backend, validator
        self.template = prompts.load(template_id)
        self.temperature, self.max_tokens, self.top_p = temperature, max_tokens, top_p
        self.max_tries, self.seed, self.no_think, self.model = max_tries, seed, no_think, model
        self.on_reject = on_reject

    def prompt(self, ps: PredicateSet) -> str:
        facts = "\n".join(f"- {f.text}" for f in ps.facts)
        return self.template.render(subject=ps.subject, question=ps.question, predicates=facts, answer=ps.answer)

    def _request(self, ps: PredicateSet, attempt: int):
        from forecasters.backends import Request, SamplingParams

        parts = (self.prompt(ps), "/no_think") if self.no_think else (self.prompt(ps),)
        sp = SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, top_p=self.top_p,
                            seed=self.seed + attempt)
        return Request(id=ps.query_id, parts=parts, sampling=sp)

    def narrate(self, sets: Sequence[PredicateSet]) -> list[NarrationResult]:
        """Narrate every predicate set: one backend call per round, rejected ones resampled in the next round."""
        results = {ps.query_id: NarrationResult(ps.query_id, False, None, TEACHER_NARRATOR, self.model, 0)
                   for ps in sets}
        pending = list(sets)
        for attempt in range(self.max_tries):
            if not pending:
                break
            comps = self.backend.generate([self._request(ps, attempt) for ps in pending])
            still = []
            for ps, comp in zip(pending, comps, strict=True):
                res = results[ps.query_id]
                res.tries += 1
                res.seeds.append(self.seed + attempt)
                if not comp.ok:
                    text, verdict = "", Verdict(False, [], 0, None)
                    summary = f"backend_error: {comp.error_kind}: {comp.error}"
                else:
                    text = strip_thinking(comp.texts[0])
                    verdict = self.validator.check(text, ps)
                    summary = verdict.summary()
                if verdict.ok:
                    res.ok, res.rationale, res.words = True, normalise_answer(text, ps.answer), verdict.words
                    continue
                res.reasons.append(summary)
                if self.on_reject is not None:
                    self.on_reject(ps.query_id, attempt, comp.texts[0] if comp.ok else None, summary)
                still.append(ps)
            pending = still
        return [results[ps.query_id] for ps in sets]


def template_results(sets: Sequence[PredicateSet], validator: RationaleValidator, on_reject=None
                     ) -> list[NarrationResult]:
    """The template narrator over predicate sets, each checked by the validator like a teacher's output."""
    out = []
    for ps in sets:
        text = template_rationale(ps, min_words=validator.min_words, max_words=validator.max_words)
        v = validator.check(text, ps)
        res = NarrationResult(ps.query_id, v.ok, text if v.ok else None, TEMPLATE_NARRATOR, TEMPLATE_VERSION, 1,
                              [] if v.ok else [v.summary()], v.words)
        if not v.ok and on_reject is not None:
            on_reject(ps.query_id, 0, text, v.summary())
        out.append(res)
    return out


# --- the job -----------------------------------------------------------------------------------------------

@dataclass
class NarrateConfig:
    """``python -m distill narrate``: predicates -> validated rationales (see the module docstring)."""

    data: str = field(metadata={"help": "benchmark directory"})
    predicates: str = field(metadata={"help": "predicates JSONL (python -m distill predicates)"})
    out: str = field(metadata={"help": "output directory (rationales.jsonl, rejects.jsonl, failures.jsonl, ...)"})
    narrator: str = field(default=TEACHER_NARRATOR, metadata={"help": "teacher | template"})
    split: str | None = field(default="train", metadata={"help": "train | val | test | null (all)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N predicate sets of the split"})
    backend: str = field(default="vllm", metadata={"help": "teacher backend: vllm | openai | hf"})
    model: str = field(default=DEFAULT_TEACHER, metadata={"help": "teacher model (HF id, path, or served name)"})
    base_url: str | None = field(default=None, metadata={"help": "openai backend: server URL"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "env var holding the API key"})
    prompt: str = field(default="teacher_narration", metadata={"help": "prompt template id or .txt path"})
    temperature: float = field(default=0.7, metadata={"help": "teacher sampling temperature (DynaPix: 0.7)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    max_tokens: int = field(default=1024, metadata={"help": "tokens per teacher sample"})
    max_tries: int = field(default=4, metadata={"help": "samples per query before it is recorded as a failure"})
    no_think: bool = field(default=True, metadata={"help": "append Qwen3's /no_think switch to the prompt"})
    min_words: int = field(default=80, metadata={"help": "validator: shortest body"})
    max_words: int = field(default=250, metadata={"help": "validator: longest body"})
    seed: int = field(default=0, metadata={"help": "try t samples with seed + t"})
    batch_size: int = field(default=256, metadata={"help": "queries per chunk (one backend call per round)"})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: tensor parallel size"})
    max_model_len: int | None = field(default=4096, metadata={"help": "vllm: context cap"})
    dtype: str = field(default="auto", metadata={"help": "auto | bfloat16 | float32"})
    concurrency: int = field(default=32, metadata={"help": "openai: requests in flight"})
    redo_failed: bool = field(default=False, metadata={"help": "retry queries recorded as failures"})
    overwrite: bool = field(default=False, metadata={"help": "discard existing outputs"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self):
        if self.narrator not in (TEACHER_NARRATOR, TEMPLATE_NARRATOR):
            raise ValueError(f"narrator must be 'teacher' or 'template', got {self.narrator!r}")

    def identity(self) -> dict[str, Any]:
        """What changes the outputs (hashed into every line's ``config_hash``)."""
        import prompts

        d = {"narrator": self.narrator, "min_words": self.min_words, "max_words": self.max_words}
        if self.narrator == TEACHER_NARRATOR:
            t = prompts.load(self.prompt)
            d.update(model=self.model, prompt_id=t.id, prompt_hash=t.hash, temperature=self.temperature,
                     top_p=self.top_p, max_tokens=self.max_tokens, max_tries=self.max_tries, seed=self.seed,
                     no_think=self.no_think)
        else:
            d["template_version"] = TEMPLATE_VERSION
        return d

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class NarrateSummary:
    selected: int = 0
    skipped_done: int = 0
    accepted: int = 0
    failed: int = 0
    tries: int = 0
    rejected_tries: int = 0
    reject_codes: dict[str, int] = field(default_factory=dict)
    mean_words: float = 0.0
    wall_s: float = 0.0
    engine: str = ""


def read_predicates(path: str | Path, split_ids: set[str] | None = None) -> list[PredicateSet]:
    from distill.jsonl import read_records
    from eval.io import FormatError

    if not Path(path).is_file():  # an input: a missing file is an error, not an empty job
        raise FormatError(path, "predicates file does not exist (run `python -m distill predicates` first)")
    out = []
    for i, d in enumerate(read_records(path), start=1):
        try:
            ps = PredicateSet.from_dict(d)
        except TypeError as e:
            raise FormatError(path, f"not a predicate set ({e})", line=i) from None
        if split_ids is None or ps.query_id in split_ids:
            out.append(ps)
    return out


def _backend(cfg: NarrateConfig):
    import os

    from forecasters.backends import BackendConfig, get_backend

    bcfg = BackendConfig(model=cfg.model, dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size,
                         max_model_len=cfg.max_model_len, base_url=cfg.base_url,
                         api_key=os.environ.get(cfg.api_key_env), concurrency=cfg.concurrency,
                         batch_size=cfg.batch_size, seed=cfg.seed, max_images=1)
    return get_backend(cfg.backend, bcfg)


def _existing(cfg: NarrateConfig, out: Path) -> tuple[set[str], set[str]]:
    """(accepted ids, failed ids) already in the outputs; refuses lines of another config."""
    from distill.jsonl import read_records, rewrite

    h = cfg.config_hash()
    files = {name: read_records(out / name) for name in ("rationales.jsonl", "failures.jsonl")}
    other = {d.get("config_hash") for rows in files.values() for d in rows} - {h}
    if other:
        raise ValueError(f"{out}: holds narration of another config ({sorted(map(str, other))}; this one is {h}); "
                         "use a new --out or pass --overwrite true")
    done = {d["query_id"] for d in files["rationales.jsonl"]}
    failed = {d["query_id"] for d in files["failures.jsonl"]}
    if cfg.redo_failed and failed:
        rewrite(out / "failures.jsonl", [])
        failed = set()
    return done, failed


def run_narration(cfg: NarrateConfig, backend=None) -> NarrateSummary:
    """Run the narration job (see the module docstring); ``backend`` reuses an already built teacher backend."""
    from tqdm.auto import tqdm

    from distill.config import write_resolved
    from distill.jsonl import Appender
    from eval.benchmark import Benchmark
    from eval.io import write_json

    t0 = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        for name in ("rationales.jsonl", "rejects.jsonl", "failures.jsonl"):
            (out / name).unlink(missing_ok=True)
    bench = Benchmark.load(cfg.data)
    split_ids = None if cfg.split is None else {q.id for q in bench.queries(cfg.split)}
    sets = read_predicates(cfg.predicates, split_ids)
    sets = sets[: cfg.limit] if cfg.limit is not None else sets
    done, failed = _existing(cfg, out)
    todo = [ps for ps in sets if ps.query_id not in done and ps.query_id not in failed]
    s = NarrateSummary(selected=len(sets), skipped_done=len(sets) - len(todo))
    from distill.validator import validator_for

    validator = validator_for(bench, min_words=cfg.min_words, max_words=cfg.max_words)
    h = cfg.config_hash()
    own = backend is None and cfg.narrator == TEACHER_NARRATOR and bool(todo)
    if own:
        backend = _backend(cfg)
    if backend is not None:
        s.engine = backend.engine_version
    else:
        s.engine = TEMPLATE_VERSION if cfg.narrator == TEMPLATE_NARRATOR else "none (nothing left to narrate)"
    write_resolved(cfg, out / "narrate.config.json", identity=cfg.identity(), config_hash=h, engine=s.engine)
    words: list[int] = []
    codes: Counter = Counter()
    with Appender(out / "rationales.jsonl") as acc, Appender(out / "rejects.jsonl") as rej, \
            Appender(out / "failures.jsonl") as fail:
        def on_reject(qid, attempt, text, summary):
            rej.write({"query_id": qid, "try": attempt, "text": text, "reasons": summary, "config_hash": h})
            s.rejected_tries += 1
            codes.update(part.split(":")[0].strip() for part in summary.split("; "))

        narrator = None if cfg.narrator == TEMPLATE_NARRATOR else TeacherNarrator(
            backend, validator, template_id=cfg.prompt, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
            top_p=cfg.top_p, max_tries=cfg.max_tries, seed=cfg.seed, no_think=cfg.no_think, model=cfg.model,
            on_reject=on_reject)
        bar = tqdm(total=len(todo), unit="q", desc=f"narrate ({cfg.narrator})", disable=not cfg.progress)
        try:
            for start in range(0, len(todo), cfg.batch_size):
                chunk = todo[start:start + cfg.batch_size]
                results = (template_results(chunk, validator, on_reject) if narrator is None
                           else narrator.narrate(chunk))
                for ps, res in zip(chunk, results, strict=True):
                    row = {**res.to_dict(), "answer": ps.answer, "qtype": ps.qtype, "config_hash": h}
                    s.tries += res.tries
                    if res.ok:
                        acc.write(row)
                        s.accepted += 1
                        words.append(res.words)
                    else:
                        fail.write(row)
                        s.failed += 1
                for f in (acc, rej, fail):
                    f.flush()
                bar.update(len(chunk))
                bar.set_postfix(ok=s.accepted, failed=s.failed, rejected_tries=s.rejected_tries, refresh=False)
        finally:
            bar.close()
            if own:
                backend.close()
    s.reject_codes = dict(codes)
    s.mean_words = round(sum(words) / len(words), 1) if words else 0.0
    s.wall_s = round(time.perf_counter() - t0, 2)
    write_json(out / "narrate.summary.json", asdict(s))
    return s
