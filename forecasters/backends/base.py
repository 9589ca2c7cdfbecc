"""The backend interface: typed requests and completions, and one base class that owns retries and failure records.

A backend turns `Request` objects (a chat: optional system text, then a user turn of text / image / video parts, plus
`SamplingParams`) into `Completion` objects (``n`` texts, token counts, or an error). Implementations override one
inner call; the base class owns:

- retries (tenacity): exponential backoff with full jitter, ``wait = uniform(0, min(wait_max, wait_initial * 2**k))``
  for attempt ``k``, at least the server's ``Retry-After``; retried are the ``transient`` errors below
  (`Backend.is_transient`), never other 4xx or programming errors; at most ``RetryPolicy.max_attempts`` calls;
- failure records: a request that still fails becomes a `Completion` with ``error`` and ``error_kind`` set; nothing
  raises out of `Backend.generate` for a per-request failure, so a batch job never crashes on one bad request;
- order: ``generate(requests)[i]`` answers ``requests[i]``; `Backend.stream` instead yields completions as they
  finish (what the batch runner uses, so lines are written as answers arrive);
- a check of the engine before the first request (`Backend.preflight`: the ``openai`` backend asks the server's
  ``/v1/models`` whether it serves the model).

Scoring (the ``likelihood`` forecaster, `forecasters.likelihood`): `Backend.score` turns `ScoreRequest` objects (a
chat prompt and candidate answers) into `ScoreResult` objects, under the same retries and failure records. The
log-likelihood of an answer ``a`` to a prompt ``x`` is

    ``l(a | x) = sum_{i=1..|a|} log p(a_i | x, a_<i)``   (natural log, nats)

over the answer's tokens ``a_1..a_|a|`` in context: the model's chat template renders the prompt with ``a`` as an
open assistant answer (``continue_final_message``: the answer's text ends the rendered prompt, no end-of-turn
token, as VCF-Lik scores a text), and the answer's tokens are those after the longest common token prefix of that
rendering and the rendering up to the answer (a token that merges the answer's first characters with the template
text before it counts as the answer's). ``|a|`` is their number. ``hf`` computes the shared prompt once per request
and the answers in batches on its KV cache; ``vllm`` reads the answers' prompt log-probabilities with the prompt in
its prefix cache; ``openai`` asks a vLLM server for prompt log-probabilities of each answer.

Error classes (`error_class`, what the runner does with a failed request):

============  ==================================================================  ==============================
class         kinds                                                               retried / job
============  ==================================================================  ==============================
transient     ``timeout``, ``connection``, ``http_429``, ``http_5xx``,            retried; a long run of them
              ``bad_response`` (a 200 whose body is not a chat completion:        stops the job (dead server)
              HTML, not JSON, no choices)
fatal         ``http_401``, ``http_403``, ``http_404`` (wrong model / adapter     not retried; stops the job at
              name, wrong key or route: every request fails alike)                once
rejected      other ``http_4xx`` (vLLM's 400 for too many images or a too large   not retried; a run of them
              ``max_tokens``), ``unsupported``, ``exception``                     stops the job
input         ``input`` (the request could not be built: a missing frame)         not retried; never stops it
============  ==================================================================  ==============================

Backends: ``hf`` (transformers, in process), ``vllm`` (``vllm.LLM``, in process) and ``openai`` (any
OpenAI-compatible HTTP server, e.g. ``vllm serve``); see `forecasters.backends.get_backend`.
"""

from __future__ import annotations

import abc
import base64
import io
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from eval.errors import EngineError, InputError, PSRError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters. ``temperature == 0`` is greedy (deterministic); ``n`` samples per request;
    ``max_tokens`` caps the generated tokens per sample; ``seed`` seeds sampling where the engine supports it."""

    temperature: float = 0.0
    max_tokens: int = 24
    top_p: float = 1.0
    n: int = 1
    seed: int | None = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if self.temperature < 0 or self.max_tokens < 1 or self.n < 1 or not 0 < self.top_p <= 1:
            raise InputError(f"invalid sampling parameters {self}")
        if self.n > 1 and self.temperature == 0:
            raise InputError("n > 1 samples need temperature > 0 (greedy decoding gives one answer)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


class ImagePart:
    """One image of a prompt (an RGB ``PIL.Image``). The PNG data URL is encoded once and cached, so frames shared
    by the queries of one prefix are encoded once."""

    def __init__(self, image, source: str = ""):
        self.image = image
        self.source = source

    @cached_property
    def data_url(self) -> str:
        buf = io.BytesIO()
        self.image.save(buf, format="PNG", compress_level=1)  # lossless either way; level 1 encodes ~5x faster
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    def __repr__(self) -> str:
        return f"ImagePart({self.source or 'image'}, {self.image.size[0]}x{self.image.size[1]})"


@dataclass(frozen=True, eq=False)
class VideoPart:
    """A video given as its frames (RGB ``PIL.Image`` list, in time order) and their rate in frames per second (the
    prompt builder sets it from the prefix's times, `forecasters.prompting.frame_rate`; Qwen-VL's processors write
    each frame's time into the prompt from it)."""

    frames: tuple[ImagePart, ...]
    fps: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise InputError(f"a video's frame rate must be a positive number, got fps={self.fps}")


Part = str | ImagePart | VideoPart


def video_metadata(video: VideoPart) -> dict[str, Any]:
    """The metadata of a video given as its frames, in the fields of transformers' ``VideoMetadata``, for processors
    that write frame times into the prompt (Qwen-VL): every frame is a sample (``frames_indices`` 0..n-1) taken at
    ``video.fps``. The processors are also told not to sample again (``do_sample_frames=False``)."""
    n, fps = len(video.frames), float(video.fps)
    return {"total_num_frames": n, "fps": fps, "duration": n / fps, "frames_indices": list(range(n))}


def missing_bos(tokenizer, rendered: str) -> bool:
    """Whether a chat prompt ``rendered`` by the model's template lacks the BOS its tokenizer adds: true for templates
    that do not write it (LLaVA-NeXT's ``[INST] ...``, whose transformers processor adds ``<s>``), false where the
    template writes it (Llama 3) or the tokenizer adds none (Qwen). The backends tokenize chat prompts with
    ``add_special_tokens`` set to this, so every engine sees the prompt transformers' processor builds, without a
    doubled BOS."""
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return False
    return tokenizer.encode("", add_special_tokens=True)[:1] == [bos_id] and not rendered.startswith(bos)


@dataclass(frozen=True, eq=False)
class Request:
    """One chat request: ``system`` text (optional), then one user turn made of ``parts`` in order."""

    id: str
    parts: tuple[Part, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    system: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(p for p in self.parts if isinstance(p, str))

    @property
    def images(self) -> list[ImagePart]:
        return [p for p in self.parts if isinstance(p, ImagePart)]

    @property
    def videos(self) -> list[VideoPart]:
        return [p for p in self.parts if isinstance(p, VideoPart)]


@dataclass
class BackendResult:
    """What every answer of a backend carries: the request's id, the shared prompt's token count (``None`` when the
    engine does not report it) and either success or an ``error``.

    ``error_kind`` is one of ``timeout``, ``connection``, ``http_<status>``, ``bad_response``, ``unsupported``,
    ``input`` (set by the runner), ``exception``; `error_class` groups them.
    ``latency_s`` is wall time from the first attempt to the answer, retries and waits included.
    """

    request_id: str
    prompt_tokens: int | None = None
    error: str | None = None
    error_kind: str | None = None
    attempts: int = 1
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Completion(BackendResult):
    """The answer to one `Request`: ``texts`` (``n`` samples) or an ``error`` (`BackendResult`).
    ``completion_tokens`` (summed over samples) is ``None`` when the engine does not report it."""

    texts: list[str] = field(default_factory=list)
    completion_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class ScoreRequest:
    """Log-likelihoods of candidate answers to one chat prompt: ``prompt`` (system + user parts; its sampling is not
    used) and the answer texts ``continuations``, each scored on its own (see the module docstring)."""

    id: str
    prompt: Request
    continuations: tuple[str, ...]

    def __post_init__(self):
        bad = [c for c in self.continuations if not isinstance(c, str) or not c.strip() or c != c.strip()]
        if bad:
            raise InputError(f"score request {self.id}: answers must be non-empty stripped strings, got {bad[:3]}")


@dataclass
class ScoreResult(BackendResult):
    """The answer to one `ScoreRequest`: per continuation ``logprobs[j] = l(c_j | prompt)`` (nats, the sum over its
    tokens) and ``n_tokens[j] = |c_j|``, in the request's order; or an ``error`` (`BackendResult`)."""

    logprobs: list[float] = field(default_factory=list)
    n_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry schedule (seconds): up to ``max_attempts`` calls; before retry ``k`` (1-based) wait
    ``uniform(0, min(wait_max, wait_initial * 2**(k-1)))``, at least a server's ``Retry-After`` (capped at wait_max)."""

    max_attempts: int = 6
    wait_initial: float = 1.0
    wait_max: float = 60.0

    def __post_init__(self):
        if self.max_attempts < 1 or self.wait_initial < 0 or self.wait_max < 0:
            raise InputError(f"invalid retry policy {self}")


@dataclass
class BackendConfig:
    """What every backend takes; each backend's own config (`HFConfig`, `VLLMConfig`, `OpenAIConfig` in its module)
    adds its settings.

    ``model``: HF id, local path, or served model name (``openai``); ``adapter``: a LoRA adapter (a local path for
    ``hf`` / ``vllm``, the served adapter name for ``openai``); ``max_pixels``: the cap the caller resized the frames
    to (recorded; backends do not resize again); ``batch_size``: requests per engine call for in-process backends,
    for ``openai`` the requests admitted ahead by `Backend.stream` (in flight or waiting for a retry); ``retry``;
    ``seed`` (sampling, and the retry jitter).
    """

    model: str
    adapter: str | None = None
    max_pixels: int | None = None
    batch_size: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key", None)  # never written to logs or configs
        return d


class TransientError(EngineError):
    """An error worth retrying (a backend raises it for conditions `is_transient` cannot see otherwise)."""


class BadResponse(TransientError):
    """A server answered 200 with a body that is not a chat completion (an HTML page from a proxy, a body that is
    not JSON, no choices): a server error, retried like a 5xx (error kind ``bad_response``)."""


class ServerUnavailable(PSRError):
    """The server cannot be reached, or refuses every request, before the first query is sent."""


class ScoringUnsupported(PSRError):
    """A backend or server that cannot score answers (log-likelihood), found before the job starts."""


class UnsupportedInput(InputError):
    """A request this backend or model cannot serve (e.g. images for a text-only model, video over HTTP)."""


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if code is None:
        resp = getattr(exc, "response", None)
        code = getattr(resp, "status_code", None)
    return code if isinstance(code, int) else None


def error_kind(exc: BaseException) -> str:
    """A short machine-readable class of an exception (see `Completion.error_kind`)."""
    if isinstance(exc, BadResponse):
        return "bad_response"
    code = _status_code(exc)
    if code is not None:
        return f"http_{code}"
    if isinstance(exc, UnsupportedInput):
        return "unsupported"
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"TimeoutError", "APITimeoutError", "TimeoutException", "ReadTimeout"}:
        return "timeout"
    if names & {"ConnectionError", "APIConnectionError", "TransportError", "RemoteProtocolError"}:
        return "connection"
    return "exception"


#: HTTP statuses that say the job's configuration is wrong (model / adapter name, key, route), not one request
FATAL_STATUSES = (401, 403, 404)


def error_class(kind: str | None) -> str:
    """``transient`` | ``fatal`` | ``rejected`` | ``input`` for a `Completion.error_kind` (table in the module
    docstring)."""
    if kind in ("timeout", "connection", "bad_response"):
        return "transient"
    if kind == "input":
        return "input"
    if kind and kind.startswith("http_") and kind[5:].isdigit():
        code = int(kind[5:])
        if code == 429 or code >= 500:
            return "transient"
        if code in FATAL_STATUSES:
            return "fatal"
    return "rejected"


def retry_after_seconds(exc: BaseException) -> float | None:
    """The ``Retry-After`` header of an HTTP error response, in seconds (numeric form only), else None."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None


class Backend(abc.ABC):
    """Base class of the backends. Subclasses implement `_generate_one` (and may override `_generate_batch` to
    call the engine once for many requests); callers use `generate`."""

    name: ClassVar[str] = "base"
    supports_images: ClassVar[bool] = True
    supports_video: ClassVar[bool] = False
    supports_scoring: ClassVar[bool] = False
    #: the config this backend takes (a subclass of `BackendConfig` with its own settings)
    config_class: ClassVar[type[BackendConfig]] = BackendConfig

    def __init__(self, config: BackendConfig):
        if not isinstance(config, self.config_class):
            raise TypeError(f"the {self.name} backend needs its config class {self.config_class.__name__}, got "
                            f"{type(config).__name__}")
        self.config = config
        self._rng = random.Random(config.seed)

    # --- what callers use ---
    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """One `Completion` per request, in order; per-request failures are recorded, never raised."""
        return self._one_each(requests, self._generate_batch, "completions")

    def _one_each(self, requests: Sequence, batch: Callable[[list], list], what: str) -> list:
        """``batch(requests)``, checked to hold one answer per request (an empty input asks nothing)."""
        if not requests:
            return []
        out = batch(list(requests))
        if len(out) != len(requests):
            raise EngineError(f"{self.name} backend returned {len(out)} {what} for {len(requests)} requests")
        return out

    def stream(self, items: Iterable[Request | Completion]) -> Iterator[list[Completion]]:
        """Answer ``items`` and yield the completions as they finish, in groups (any order; each request once).

        An item that is already a `Completion` (a request that failed before it could be sent, e.g. a missing
        frame) is yielded as is. ``items`` is consumed lazily, so the caller builds requests while earlier ones
        run. Default: chunks of ``config.batch_size`` through `generate` (one group per chunk); the ``openai``
        backend keeps ``concurrency`` requests in flight and yields each as soon as it is answered. Closing the
        generator early (the caller stops) abandons the requests not yet answered.
        """
        return self._chunked(items, self.generate)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """One `ScoreResult` per request, in order; per-request failures are recorded, never raised."""
        return self._one_each(requests, self._score_batch, "scores")

    def stream_scores(self, items: Iterable[ScoreRequest | ScoreResult]) -> Iterator[list[ScoreResult]]:
        """`stream` for `ScoreRequest` items: results as they finish (default: chunks of ``batch_size``)."""
        return self._chunked(items, self.score)

    def _chunked(self, items, call) -> Iterator[list]:
        chunk: list = []
        for item in items:
            if isinstance(item, BackendResult):
                yield [item]
                continue
            chunk.append(item)
            if len(chunk) >= max(1, self.config.batch_size):
                yield call(chunk)
                chunk = []
        if chunk:
            yield call(chunk)

    def preflight(self) -> None:
        """Check the engine before the first request (raise `ServerUnavailable` / `ModelNotFound`). In-process
        engines have loaded the model by now: nothing to check."""
        return None

    def check_scoring(self) -> None:
        """Before a scoring job: raise `ScoringUnsupported` when this backend (or its server) cannot score answers."""
        if not self.supports_scoring:
            raise ScoringUnsupported(f"the {self.name} backend cannot score answers (log-likelihood)",
                                     fix="use --backend hf, vllm or openai (a vLLM server)")

    @property
    def engine_version(self) -> str:
        """``"<engine> <version>"`` of what generates (logged with every run)."""
        return self.name

    def close(self) -> None:
        """Release the engine (models, connections). Idempotent."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- what subclasses implement ---
    @abc.abstractmethod
    def _generate_one(self, request: Request) -> Completion:
        """Answer one request or raise (the base decides whether to retry)."""

    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        """Default: each request through `_run_one` (retries included). Batch engines override this."""
        return [self._run_one(r) for r in requests]

    def _score_one(self, request: ScoreRequest) -> ScoreResult:
        """Score one request or raise (the base decides whether to retry). Backends that score override this."""
        raise UnsupportedInput(f"the {self.name} backend cannot score answers (log-likelihood)")

    def _score_batch(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """Default: each request through `_run_one` with `_score_one`."""
        return [self._run_one(r, self._score_one) for r in requests]

    # --- retries and failure records ---
    def is_transient(self, exc: BaseException) -> bool:
        """Worth retrying: timeouts, connection errors, HTTP 429 and 5xx. Never other 4xx or local errors."""
        if isinstance(exc, TransientError):
            return True
        return error_class(error_kind(exc)) == "transient"

    def backoff_seconds(self, attempt: int, exc: BaseException | None = None) -> float:
        """Wait before retry number ``attempt`` (1-based): full jitter, at least the server's Retry-After."""
        pol = self.config.retry
        cap = min(pol.wait_max, pol.wait_initial * (2 ** (attempt - 1)))
        wait = self._rng.uniform(0, cap)
        ra = retry_after_seconds(exc) if exc is not None else None
        if ra is not None:
            wait = max(wait, min(ra, pol.wait_max))
        return wait

    def _tenacity_kwargs(self) -> dict[str, Any]:
        import tenacity

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.backoff_seconds(state.attempt_number, exc)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.info("%s: retry %d after %s: %s", self.name, state.attempt_number, error_kind(exc), exc)

        return dict(stop=tenacity.stop_after_attempt(self.config.retry.max_attempts), wait=wait,
                    retry=tenacity.retry_if_exception(self.is_transient), reraise=True, before_sleep=before_sleep)

    def failure(self, request: Request | ScoreRequest, exc: BaseException, attempts: int,
                t0: float) -> BackendResult:
        """The failure record of a request: a `ScoreResult` for a `ScoreRequest`, else a `Completion`."""
        kind = error_kind(exc)
        msg = f"{type(exc).__name__}: {exc}".strip()
        if len(msg) > 500:
            msg = msg[:500] + "..."
        log.warning("%s: request %s failed after %d attempt(s): %s", self.name, request.id, attempts, msg)
        cls = ScoreResult if isinstance(request, ScoreRequest) else Completion
        return cls(request_id=request.id, error=msg, error_kind=kind, attempts=attempts,
                   latency_s=time.perf_counter() - t0)

    def _run_one(self, request: Request | ScoreRequest, call=None) -> BackendResult:
        """``call(request)`` (default `_generate_one`) under the retry policy; a request that still fails becomes a
        failure record."""
        import tenacity

        call = call or self._generate_one
        t0 = time.perf_counter()
        attempts = 0
        try:
            for attempt in tenacity.Retrying(**self._tenacity_kwargs()):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    c = call(request)
            c.attempts, c.latency_s = attempts, time.perf_counter() - t0
            return c
        except Exception as e:  # recorded, never raised: one bad request must not crash a batch job
            return self.failure(request, e, attempts, t0)

    async def _arun_one(self, request: Request | ScoreRequest, call) -> BackendResult:
        """Async twin of `_run_one`: ``await call(request)`` under the retry policy."""
        import tenacity

        t0 = time.perf_counter()
        attempts = 0
        try:
            async for attempt in tenacity.AsyncRetrying(**self._tenacity_kwargs()):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    c = await call(request)
            c.attempts, c.latency_s = attempts, time.perf_counter() - t0
            return c
        except Exception as e:
            return self.failure(request, e, attempts, t0)

    def check_supported(self, request: Request) -> None:
        """Raise `UnsupportedInput` for media this backend cannot take (recorded as an ``unsupported`` failure)."""
        if request.images and not self.supports_images:
            raise UnsupportedInput(f"the {self.name} backend cannot take images")
        if request.videos and not self.supports_video:
            raise UnsupportedInput(f"the {self.name} backend cannot take video input")
