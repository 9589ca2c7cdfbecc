"""Narration: predicates -> a chain-of-thought rationale that states the evidence first and the answer once, at
the end, on its ``Answer: <state phrase>`` line.

Three narrators, each recorded in every output line (``narrator``):

- ``teacher`` (DynaPix §5.1: Qwen3-32B at temperature 0.7): the ``teacher_narration`` prompt (`prompts`, id + hash
  recorded) with the query's predicates, one per line (the answer given apart, to be stated only on the last line),
  goes to a text model through any `forecasters` backend (``vllm`` in process, ``openai`` for a served model, ``hf``
  for small local models). Each output is validated (`distill.validator`); rejected ones are resampled with a new
  seed, at most ``max_tries`` times per query. Every rejected try is logged with its reasons; a query that exhausts
  its tries becomes a failure record. ``<think>...</think>`` blocks are dropped before validation; with
  ``no_think`` the user turn ends in ``/no_think`` (Qwen3's switch for answering without a thinking block).
- ``template`` (deterministic, for offline use and tests): the predicates arranged as scene (the layout the frames
  show, or the domain when there is no simulator record), motion and reasoning paragraphs (evidence, then the
  intermediate trajectory), a closing sentence that does not name the answer, padded
  with fixed connective sentences to the validator's minimum length. The answer appears only on the answer line
  (and in the body only where it is also the observed current state or a Q5 object's end state).
- ``template-noisy`` (a stand-in for a sampling teacher on CPU: tests and the CPU demo): try ``t`` of a query is the
  template rationale with, at probability ``fault_rate``, one injected mistake (`FAULTS`: a number, a spelled
  measure, a frame index, a post-horizon state, "the correct answer is", a contradicted direction, a degenerate
  body), drawn from ``seed + t``; the validator rejects it and the query is resampled, as with the teacher.

An accepted rationale is stored with its answer line normalised to the canonical target state (the teacher may
answer with a listed synonym), so SFT targets and the student parser agree, and with ``trajectory_target``, the
target of the trajectory-labels control (`TARGET_VARIANTS`, `assistant_target`).

Job (``python -m distill narrate``), resumable: ``<out>/rationales.jsonl`` (accepted), ``<out>/rejects.jsonl``
(every rejected try: query id, try, text, reasons), ``<out>/failures.jsonl`` (queries that exhausted their tries),
``<out>/narrate.config.json`` (resolved config, prompt id/hash, engine) and ``<out>/narrate.summary.json``. A rerun
skips queries already accepted or failed (``redo_failed`` retries the failures); lines of another config are refused.
The files are appended and resumed through `eval.resumable` (whole lines, fsynced per chunk; a torn tail is cut).
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

from distill.facts import PredicateSet
from distill.validator import RationaleValidator, Verdict, split_answer
from eval.errors import InputError

log = logging.getLogger(__name__)

TEMPLATE_NARRATOR = "template"
NOISY_NARRATOR = "template-noisy"
TEACHER_NARRATOR = "teacher"
TEMPLATE_VERSION = "template-v3"
DEFAULT_TEACHER = "Qwen/Qwen3-32B"
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)


# --- the deterministic template narrator -------------------------------------------------------------------

_OPENERS = ("Let me first look at the scene.", "First, what the frames show.", "I start by parsing the scene.")
_MOTION_OPENERS = ("Next, the motion.", "Now I analyse how things move.", "Then I look at the motion.")
_REASON_OPENERS = ("Now I follow this forward.", "From here I can reason about what comes next.",
                   "Putting this together:")
_CLOSERS = ("Following this evidence to the moment the question asks about gives the state below.",
            "Taken together, these cues decide what the {subject} is doing at the moment asked about.",
            "This evidence points to a single state at the moment the question asks about.")
_PADDING = (
    "The question asks about the {subject}, so I keep my attention on it and on what surrounds it.",
    "What matters is how it moves at the end of the clip and what will act on it after that.",
    "Nothing in the frames points to a different course of events than the one described here.",
    "Each step follows from the one before it, so the sequence should play out in this order.",
    "I do not need exact distances or times for this; the qualitative picture is enough.",
)
#: facts dropped first (in this order) when a template rationale would exceed the word limit
_DROP_ORDER = ("scene_objects", "layout", "relative_speed", "speed_trend", "contact_now", "edge", "container",
               "observed_detail", "time_to_target", "support_now", "collision_course", "other_end_state", "direction")


def _pick(options: Sequence[str], key: str, salt: int) -> str:
    return options[(zlib.crc32(key.encode()) + salt) % len(options)]


def _paragraphs(ps: PredicateSet, drop: set[str], padding: int) -> list[str]:
    """Scene, motion and reasoning paragraphs: evidence first; the answer fact is never narrated in the body."""
    facts = [f for f in ps.facts if f.kind not in drop and f.section != "answer"]
    intro = [] if any(f.kind == "layout" for f in facts) else \
        [f"The frames show the {ps.subject} in a {ps.domain.replace('_', ' ')} scene."]
    scene = [_pick(_OPENERS, ps.query_id, 0), *intro] + [f.text for f in facts if f.section == "scene"]
    motion = [f.text for f in facts if f.section == "motion"]
    reason = [f.text for f in facts if f.section == "trajectory"]
    reason += [p.format(subject=ps.subject) for p in _PADDING[:padding]]
    reason.append(_pick(_CLOSERS, ps.query_id, 3).format(subject=ps.subject))
    paras = [" ".join(scene)]
    if motion:
        paras.append(" ".join([_pick(_MOTION_OPENERS, ps.query_id, 1), *motion]))
    paras.append(" ".join([_pick(_REASON_OPENERS, ps.query_id, 2), *reason]))
    return paras


def template_rationale(ps: PredicateSet, *, min_words: int = 80, max_words: int = 250) -> str:
    """The deterministic rationale of one query: scene, motion and reasoning paragraphs (evidence and the
    trajectory, never the answer), then the answer line, the only place the answer is stated.

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


# --- SFT targets: the CoT, the answer-only control and the trajectory-labels control -----------------------

TARGET_VARIANTS = ("cot", "answer", "trajectory")
"""Assistant targets of the SFT sets, one per student (`assistant_target`):

- ``cot``: the rationale (evidence, trajectory, reasoning) ending in ``Answer: <state>``;
- ``answer``: ``Answer: <state>`` alone;
- ``trajectory``: the state labels the CoT names (the current state, the intermediate states, the Q5 other
  objects' end states), one per line, then ``Answer: <state>``, with no evidence or reasoning text. CoT vs
  trajectory isolates the reasoning text; trajectory vs answer-only isolates the extra labels.
"""


def trajectory_target(ps: PredicateSet) -> str:
    """The ``trajectory`` variant's target: ``Now: <current>``, ``Then: <state>`` per intermediate state,
    ``Also: <other object's end state>`` per Q5 fact, ``Answer: <target>``."""
    lines = [f"Now: {ps.current}"] + [f"Then: {s}" for s in ps.intermediate]
    lines += [f"Also: {f.text}" for f in ps.facts if f.kind == "other_end_state"]
    return "\n".join([*lines, f"Answer: {ps.answer}"])


def assistant_target(variant: str, row: dict[str, Any]) -> str:
    """The assistant text of one SFT example for ``variant`` (`TARGET_VARIANTS`), from a ``rationales.jsonl`` row
    (fields ``rationale``, ``answer``, ``trajectory_target``, written by `run_narration`)."""
    from eval.errors import InputError

    if variant == "cot":
        return row["rationale"]
    if variant == "answer":
        return f"Answer: {row['answer']}"
    if variant == "trajectory":
        if not isinstance(row.get("trajectory_target"), str):
            raise InputError(f"rationale row of query {row.get('query_id')!r} has no trajectory_target",
                             fix="rerun `python -m distill narrate` (narrations before template-v2 lack it)")
        return row["trajectory_target"]
    raise InputError(f"unknown SFT variant {variant!r}; expected one of {TARGET_VARIANTS}")


# --- the noisy template narrator: a stand-in for a sampling teacher -------------------------------------------

FAULTS = ("number", "spelled_measure", "frame_index", "future_leak", "answer_statement", "contradiction",
          "lexical_diversity")
"""Faults `noisy_rationale` injects; each is a mistake a sampling teacher makes and one validator code catches."""

FAULT_ROOM = 40
"""Words a noisy rationale keeps free for its injected sentence (the longest: a post-horizon state phrasing)."""

_SPELLED = ("It takes a couple of seconds to get there.", "The change comes in three quarters of a second.",
            "That leaves fifteen hundredths of the clip.", "It needs five-tenths of a second for that.")


def noisy_rationale(ps: PredicateSet, fault: str, rng, members: dict[str, Sequence[str]], *,
                    min_words: int = 80, max_words: int = 250) -> str:
    """`template_rationale` with one injected ``fault`` (`FAULTS`), chosen and worded with ``rng``
    (a `random.Random`). The template leaves room for the injected sentence (`FAULT_ROOM` words), so the fault is
    the only thing wrong with the text."""
    text = template_rationale(ps, min_words=min_words, max_words=max(min_words, max_words - FAULT_ROOM))
    body, answer_line = text.rsplit("\n", 1)
    subj = ps.subject
    if fault == "number":
        extra = f"The change comes in about {rng.uniform(0.2, 2.5):.1f} seconds."
    elif fault == "spelled_measure":
        extra = rng.choice(_SPELLED)
    elif fault == "frame_index":
        extra = rng.choice(("By the fourth frame it has started to change.", "At frame fifteen it changes."))
    elif fault == "future_leak" and ps.after_horizon_states:
        later = rng.choice(ps.after_horizon_states)
        extra = f"Much later the {subj} ends up {rng.choice(list(members.get(later, (later,))))}."
    elif fault == "contradiction" and ps.fact("direction") is not None:
        d = ps.fact("direction")
        flipped = (f"At the end of the clip the {subj} is moving to the left." if d.value == "still"
                   else f"The {subj} is not moving at the end of the clip.")
        return f"{body.replace(d.text, flipped)}\n{answer_line}"
    elif fault == "lexical_diversity":
        return f"{' '.join(['the'] * 90)}\n{answer_line}"
    else:  # answer_statement, and the fallback of faults this query cannot carry
        extra = f"The correct answer is {ps.answer}."
    return f"{body} {extra}\n{answer_line}"


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
            raise InputError(f"max_tries must be >= 1, got {max_tries}")
        self.backend, self.validator = backend, validator
        self.template = prompts.load(template_id)
        self.temperature, self.max_tokens, self.top_p = temperature, max_tokens, top_p
        self.max_tries, self.seed, self.no_think, self.model = max_tries, seed, no_think, model
        self.on_reject = on_reject

    def prompt(self, ps: PredicateSet) -> str:
        facts = "\n".join(f"- {f.text}" for f in ps.facts if f.section != "answer")
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


def template_results(sets: Sequence[PredicateSet], validator: RationaleValidator, on_reject=None, *,
                     fault_rate: float = 0.0, max_tries: int = 1, seed: int = 0) -> list[NarrationResult]:
    """The template narrator over predicate sets, each try checked by the validator like a teacher's output.

    With ``fault_rate > 0`` (the ``template-noisy`` narrator) try ``t`` injects a fault (`noisy_rationale`) at that
    probability, drawn from ``random.Random(crc32(query id) + seed + t)``; rejected tries are resampled up to
    ``max_tries``."""
    import random

    narrator = NOISY_NARRATOR if fault_rate > 0 else TEMPLATE_NARRATOR
    out = []
    for ps in sets:
        res = NarrationResult(ps.query_id, False, None, narrator, TEMPLATE_VERSION, 0)
        for attempt in range(max_tries):
            rng = random.Random(zlib.crc32(ps.query_id.encode()) + seed + attempt)
            if rng.random() < fault_rate:
                text = noisy_rationale(ps, rng.choice(FAULTS), rng, validator.members,
                                       min_words=validator.min_words, max_words=validator.max_words)
            else:
                text = template_rationale(ps, min_words=validator.min_words, max_words=validator.max_words)
            v = validator.check(text, ps)
            res.tries += 1
            res.seeds.append(seed + attempt)
            if v.ok:
                res.ok, res.rationale, res.words = True, text, v.words
                break
            res.reasons.append(v.summary())
            if on_reject is not None:
                on_reject(ps.query_id, attempt, text, v.summary())
        out.append(res)
    return out


# --- the job -----------------------------------------------------------------------------------------------

@dataclass
class NarrateConfig:
    """``python -m distill narrate``: predicates -> validated rationales (see the module docstring)."""

    data: str = field(metadata={"help": "benchmark directory"})
    predicates: str = field(metadata={"help": "predicates JSONL (python -m distill predicates)"})
    out: str = field(metadata={"help": "output directory (rationales.jsonl, rejects.jsonl, failures.jsonl, ...)"})
    narrator: str = field(default=TEACHER_NARRATOR, metadata={"help": "teacher | template | template-noisy"})
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
    fault_rate: float = field(default=0.3, metadata={"help": "template-noisy: probability of a fault per try"})
    no_think: bool = field(default=True, metadata={"help": "append Qwen3's /no_think switch to the prompt"})
    min_words: int = field(default=80, metadata={"help": "validator: shortest body"})
    max_words: int = field(default=250, metadata={"help": "validator: longest body"})
    semantic_leaks: bool = field(default=False, metadata={
        "help": "validator: also reject post-horizon states described in free words (distill.semantic, MiniLM)"})
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
        if self.narrator not in (TEACHER_NARRATOR, TEMPLATE_NARRATOR, NOISY_NARRATOR):
            raise InputError(f"narrator must be 'teacher', 'template' or 'template-noisy', got {self.narrator!r}")
        if not 0.0 <= self.fault_rate < 1.0:
            raise InputError(f"fault_rate must be in [0, 1), got {self.fault_rate}")

    def identity(self) -> dict[str, Any]:
        """What changes the outputs (hashed into every line's ``config_hash``)."""
        import prompts

        d = {"narrator": self.narrator, "min_words": self.min_words, "max_words": self.max_words}
        if self.semantic_leaks:
            from distill.semantic import MARGIN, THRESHOLD

            d["semantic_leaks"] = {"threshold": THRESHOLD, "margin": MARGIN}
        if self.narrator == TEACHER_NARRATOR:
            t = prompts.load(self.prompt)
            d.update(model=self.model, prompt_id=t.id, prompt_hash=t.hash, temperature=self.temperature,
                     top_p=self.top_p, max_tokens=self.max_tokens, max_tries=self.max_tries, seed=self.seed,
                     no_think=self.no_think)
        else:
            d["template_version"] = TEMPLATE_VERSION
        if self.narrator == NOISY_NARRATOR:
            d.update(fault_rate=self.fault_rate, max_tries=self.max_tries, seed=self.seed)
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
    from eval.io import FormatError
    from eval.resumable import read_records

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

    from forecasters.backends import config_for, get_backend

    bcfg = config_for(cfg.backend, model=cfg.model, dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size,
                      max_model_len=cfg.max_model_len, base_url=cfg.base_url,
                      api_key=os.environ.get(cfg.api_key_env), concurrency=cfg.concurrency,
                      batch_size=cfg.batch_size, seed=cfg.seed, max_images=1)
    return get_backend(cfg.backend, bcfg)


def _existing(cfg: NarrateConfig, out: Path) -> tuple[set[str], set[str]]:
    """(accepted ids, failed ids) already in the outputs (their complete lines, `eval.resumable.scan`); refuses
    lines of another config."""
    from eval.io import write_jsonl
    from eval.resumable import scan

    h = cfg.config_hash()
    files = {name: scan(out / name) for name in ("rationales.jsonl", "failures.jsonl")}
    other = {c for lines in files.values() for c in lines.config_hashes()} - {h}
    if other:
        raise InputError(f"{out}: holds narration of another config ({sorted(map(str, other))}; this one is {h}); "
                         "use a new --out or pass --overwrite true")
    done = files["rationales.jsonl"].keys("query_id")
    failed = files["failures.jsonl"].keys("query_id")
    if cfg.redo_failed and failed:
        write_jsonl(out / "failures.jsonl", [])
        failed = set()
    return done, failed


def run_narration(cfg: NarrateConfig, backend=None) -> NarrateSummary:
    """Run the narration job (see the module docstring); ``backend`` reuses an already built teacher backend."""
    from tqdm.auto import tqdm

    from distill.config import write_resolved
    from eval.benchmark import Benchmark
    from eval.io import write_json
    from eval.resumable import Appender

    t0 = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        for name in ("rationales.jsonl", "rejects.jsonl", "failures.jsonl"):
            (out / name).unlink(missing_ok=True)
    bench = Benchmark.load(cfg.data)
    split_ids = None if cfg.split is None else set(bench.query_field("id", cfg.split))
    sets = read_predicates(cfg.predicates, split_ids)
    sets = sets[: cfg.limit] if cfg.limit is not None else sets
    done, failed = _existing(cfg, out)
    todo = [ps for ps in sets if ps.query_id not in done and ps.query_id not in failed]
    s = NarrateSummary(selected=len(sets), skipped_done=len(sets) - len(todo))
    from distill.validator import validator_for

    validator = validator_for(bench, min_words=cfg.min_words, max_words=cfg.max_words, semantic=cfg.semantic_leaks)
    h = cfg.config_hash()
    own = backend is None and cfg.narrator == TEACHER_NARRATOR and bool(todo)
    if own:
        backend = _backend(cfg)
    if backend is not None:
        s.engine = backend.engine_version
    else:
        s.engine = TEMPLATE_VERSION if cfg.narrator != TEACHER_NARRATOR else "none (nothing left to narrate)"
    write_resolved(cfg, out / "narrate.config.json", identity=cfg.identity(), config_hash=h, engine=s.engine)
    words: list[int] = []
    codes: Counter = Counter()
    with Appender(out / "rationales.jsonl") as acc, Appender(out / "rejects.jsonl") as rej, \
            Appender(out / "failures.jsonl") as fail:
        def on_reject(qid, attempt, text, summary):
            rej.write({"query_id": qid, "try": attempt, "text": text, "reasons": summary, "config_hash": h})
            s.rejected_tries += 1
            codes.update(part.split(":")[0].strip() for part in summary.split("; "))

        narrator = None if cfg.narrator != TEACHER_NARRATOR else TeacherNarrator(
            backend, validator, template_id=cfg.prompt, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
            top_p=cfg.top_p, max_tries=cfg.max_tries, seed=cfg.seed, no_think=cfg.no_think, model=cfg.model,
            on_reject=on_reject)
        bar = tqdm(total=len(todo), unit="q", desc=f"narrate ({cfg.narrator})", disable=not cfg.progress)
        try:
            for start in range(0, len(todo), cfg.batch_size):
                chunk = todo[start:start + cfg.batch_size]
                results = narrator.narrate(chunk) if narrator is not None else template_results(
                    chunk, validator, on_reject, fault_rate=cfg.fault_rate if cfg.narrator == NOISY_NARRATOR else 0.0,
                    max_tries=cfg.max_tries if cfg.narrator == NOISY_NARRATOR else 1, seed=cfg.seed)
                for ps, res in zip(chunk, results, strict=True):
                    row = {**res.to_dict(), "answer": ps.answer, "qtype": ps.qtype, "config_hash": h,
                           "trajectory_target": trajectory_target(ps)}
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
