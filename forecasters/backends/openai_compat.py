"""The ``openai`` backend: any OpenAI-compatible chat-completions server (``vllm serve``, SGLang, a hosted API).

One HTTP client per backend (so per job): an ``httpx.AsyncClient`` on an event loop in a background thread, with a
connection pool of ``concurrency`` keep-alive connections, posting OpenAI chat-completions JSON to
``<base_url>/chat/completions``. (httpx rather than the ``openai`` package's client: the latter spent about 3x the
CPU per request, measured with ``scripts/bench_runner.py``, and on a few shared cores that CPU delays every
answer.) At most ``OpenAIConfig.concurrency`` requests are in
flight at the server; a request waiting to be retried (the base class's back-off) holds no such slot, so the server
keeps seeing ``concurrency`` requests while others wait. `stream` admits at most ``batch_size`` requests ahead (in
flight or waiting for a retry; default ``4 x concurrency``), builds their messages in the caller's thread (the PNG
encoding of frames stays off the event loop) and yields each completion as soon as it is answered.

Each request has its own timeout (``timeout_s``) and the base class's retry policy (attempts are counted in one
place). An error status raises `ServerHTTPError` (kind ``http_<status>``, the server's own message kept, its
``Retry-After`` honoured). A 200 whose body is not a chat completion (an HTML page, not JSON, no choices) raises
`BadResponse`, a server error that is retried and, if it persists, recorded so that
``--redo-failed`` redoes it. Before the first request, `preflight` asks ``GET /v1/models`` whether the server
answers and serves the model (``--model``, or ``--adapter`` when set: a LoRA adapter the server registered with
``--lora-modules NAME=PATH``), then vLLM's ``/tokenize`` whether the chat template lacks the tokenizer's BOS
(`OpenAIBackend.adds_bos`: then every request asks for ``add_special_tokens``, as transformers' processor adds it).

Images travel as base64 PNG data URLs (``image_url`` parts), encoded once per frame. A video travels as vLLM's
``video/jpeg`` data URL of its frames (a ``video_url`` part) with its frame rate in vLLM's ``media_io_kwargs``
(``vllm serve --trust-request-mm-kwargs``); a server that takes neither answers 4xx (a ``rejected`` failure, with the
server's message).

Scoring (`OpenAIBackend.score`, the ``likelihood`` forecaster) needs a server that returns prompt
log-probabilities of a chat completion: vLLM's extensions ``continue_final_message`` (the answer is rendered as an
open assistant turn by the server's chat template) and ``prompt_logprobs`` (the log-probability of every prompt
token given the ones before it), the chat counterpart of the completions API's ``echo`` + ``logprobs`` (which takes
no images). Each answer is one request (``max_tokens=1``); its score is the sum of the log-probabilities of the
prompt's last tokens that spell the answer (`forecasters.backends.scoring.answer_tokens_from_strings`, from the
tokens' decoded strings). The answers of one query go out concurrently, within ``concurrency``. vLLM reads no
prefix cache for a request with prompt log-probabilities, so over HTTP the prompt is computed once per answer:
``hf`` or ``vllm`` in process compute it once per query. `OpenAIBackend.check_scoring` sends one probe request
before the job and stops it (`ScoringUnsupported`) when the server does not answer with prompt log-probabilities.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from eval.errors import InputError, ModelNotFound
from forecasters.backends.base import (
    Backend,
    BackendConfig,
    BackendResult,
    BadResponse,
    Completion,
    ImagePart,
    Request,
    ScoreRequest,
    ScoreResult,
    ScoringUnsupported,
    ServerUnavailable,
    UnsupportedInput,
    VideoPart,
    error_class,
    error_kind,
)
from forecasters.backends.scoring import answer_tokens_from_strings

log = logging.getLogger(__name__)


def video_data_url(video: VideoPart) -> str:
    """A video as vLLM's ``video/jpeg`` data URL: its frames' base64 images joined by commas. The frames go as PNG
    (vLLM decodes each with its image loader, whatever the declared type), so they arrive lossless."""
    return "data:video/jpeg;base64," + ",".join(f.data_url.split(",", 1)[1] for f in video.frames)


def to_openai_messages(request: Request) -> list[dict]:
    """The chat messages of a request in the OpenAI schema (images as data-URL ``image_url`` parts, a video as a
    ``video_url`` part holding `video_data_url`)."""
    content: list[dict] = []
    for p in request.parts:
        if isinstance(p, str):
            content.append({"type": "text", "text": p})
        elif isinstance(p, ImagePart):
            content.append({"type": "image_url", "image_url": {"url": p.data_url}})
        elif isinstance(p, VideoPart):
            content.append({"type": "video_url", "video_url": {"url": video_data_url(p)}})
        else:
            raise UnsupportedInput(f"the openai backend cannot send a {type(p).__name__}")
    msgs = [{"role": "system", "content": request.system}] if request.system else []
    if len(content) == 1 and content[0]["type"] == "text":
        msgs.append({"role": "user", "content": content[0]["text"]})
    else:
        msgs.append({"role": "user", "content": content})
    return msgs


class ServerHTTPError(Exception):
    """An HTTP error status from the server. ``status_code`` and ``response`` (its headers carry ``Retry-After``)
    let the base class classify and time the retry; the message keeps the server's own error text."""

    def __init__(self, response):
        self.response, self.status_code = response, response.status_code
        text = response.text[:300]
        try:
            err = response.json()
            err = err.get("error", err) if isinstance(err, dict) else err
            text = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
        except ValueError:
            pass
        super().__init__(f"HTTP {response.status_code}: {text}")


def parse_chat_body(request_id: str, body: bytes) -> Completion:
    """A `Completion` from the body of a 200 answer; `BadResponse` when it is not a chat completion (not JSON, not
    an object, no choices, choices without a message)."""
    try:
        d = json.loads(body)
    except ValueError:
        raise BadResponse(f"the server answered 200 with a body that is not JSON: {body[:120]!r}") from None
    choices = d.get("choices") if isinstance(d, dict) else None
    if not isinstance(choices, list) or not choices:
        raise BadResponse(f"the server answered 200 with no choices: {body[:120]!r}")
    try:
        choices = sorted(choices, key=lambda c: c.get("index") or 0)
        texts = [c["message"].get("content") or "" for c in choices]
    except (AttributeError, KeyError, TypeError) as e:
        raise BadResponse(f"the server answered 200 with malformed choices ({type(e).__name__}: {e})") from None
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else {}
    return Completion(request_id=request_id, texts=texts, prompt_tokens=usage.get("prompt_tokens"),
                      completion_tokens=usage.get("completion_tokens"),
                      finish_reasons=[str(c.get("finish_reason")) for c in choices])


def parse_score_body(request_id: str, body: bytes, answer: str) -> ScoreResult:
    """The `ScoreResult` of one answer from the body of a 200 chat completion carrying ``prompt_logprobs`` (one
    ``{token_id: {logprob, rank, decoded_token}}`` per prompt token, None for the first). `UnsupportedInput` when the
    body has no prompt log-probabilities (the server ignored the request for them); `BadResponse` when it is not
    JSON."""
    try:
        d = json.loads(body)
    except ValueError:
        raise BadResponse(f"the server answered 200 with a body that is not JSON: {body[:120]!r}") from None
    plp = d.get("prompt_logprobs") if isinstance(d, dict) else None
    if not isinstance(plp, list) or len(plp) < 2:
        raise UnsupportedInput("the server's chat completion carries no prompt_logprobs (it does not score prompts: "
                               "likelihood scoring over HTTP needs a vLLM server)")
    try:
        entries = [next(iter(e.values())) for e in plp[1:]]
        if any(len(e) != 1 for e in plp[1:]):
            raise InputError("more than one log-probability per prompt token (asked for prompt_logprobs=0)")
        n = answer_tokens_from_strings([e.get("decoded_token") or "" for e in entries], answer)
        logp = float(sum(float(e["logprob"]) for e in entries[-n:]))
    except (AttributeError, KeyError, TypeError, ValueError, StopIteration) as e:
        raise BadResponse(f"the server's prompt_logprobs cannot be read ({type(e).__name__}: {e})") from None
    return ScoreResult(request_id=request_id, logprobs=[logp], n_tokens=[n], prompt_tokens=len(plp) - n)


class _Loop:
    """An asyncio event loop in a daemon thread, holding the backend's one HTTP client for the whole job."""

    def __init__(self, make_client, concurrency: int):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="openai-backend")
        self.thread.start()

        async def setup():
            return make_client(), asyncio.Semaphore(concurrency)

        self.client, self.slots = self.submit(setup()).result()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        async def shutdown():  # requests abandoned by a stopped job end here, then the connections close
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

        try:
            self.submit(shutdown()).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@dataclass
class OpenAIConfig(BackendConfig):
    """The ``openai`` backend's settings (`BackendConfig`'s, and): ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``),
    ``api_key`` (never written to logs or configs), ``timeout_s`` per request, ``concurrency`` (requests in flight
    at the server), ``add_special_tokens`` (vLLM's request field: the tokenizer's BOS in front of the rendered chat;
    None asks the server, `OpenAIBackend.adds_bos`)."""

    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    concurrency: int = 8
    add_special_tokens: bool | None = None


class OpenAIBackend(Backend):
    name = "openai"
    supports_images = True
    supports_video = True
    supports_scoring = True
    config_class = OpenAIConfig

    def __init__(self, config: OpenAIConfig):
        super().__init__(config)
        if not config.base_url:
            raise InputError("the openai backend needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        self._loop: _Loop | None = None
        self._lock = threading.Lock()

    @property
    def served_model(self) -> str:
        """The model field of every request: the adapter's served name when set, else the model."""
        return self.config.adapter or self.config.model

    def _get(self, url: str, timeout: float):
        """``GET url`` on the job's client (no new client, no new connection pool)."""
        return self._ensure_loop().submit(self._ensure_loop().client.get(url, timeout=timeout)).result()

    def _tokenize(self, body: dict) -> list[int]:
        """The token ids vLLM's ``POST /tokenize`` gives for ``body`` (on the job's client; an error status raises
        `ServerHTTPError`, retried when transient)."""
        loop = self._ensure_loop()
        url = self.config.base_url.rstrip("/").removesuffix("/v1") + "/tokenize"
        r = loop.submit(loop.client.post(url, json={"model": self.served_model, **body},
                                         timeout=min(self.config.timeout_s, 30.0))).result()
        if r.status_code != 200:
            raise ServerHTTPError(r)
        return [int(t) for t in r.json()["tokens"]]

    def _ask_bos(self) -> bool:
        plain = self._tokenize({"prompt": "x", "add_special_tokens": False})
        special = self._tokenize({"prompt": "x", "add_special_tokens": True})
        chat = self._tokenize({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True,
                               "add_special_tokens": False})
        bos = special[0] if len(special) == len(plain) + 1 and special[1:] == plain else None
        return bos is not None and chat[:1] != [bos]

    def _bos_decided(self) -> bool:
        """`adds_bos` as decided so far (a body built before the server was asked, offline, gets no field)."""
        if self.config.add_special_tokens is not None:
            return self.config.add_special_tokens
        return bool(self.__dict__.get("adds_bos", False))

    @functools.cached_property
    def adds_bos(self) -> bool:
        """Whether requests carry ``add_special_tokens``: ``OpenAIConfig.add_special_tokens`` when set, else asked
        once of the server (vLLM's ``/tokenize``; transient failures retried under the retry policy, and a failure
        that persists raises, so no request goes out undecided). vLLM tokenizes a chat completion without special
        tokens, so a template that does not write the BOS its tokenizer adds (LLaVA-NeXT) reaches the model
        without it, unlike transformers' processor; such a server gets the field (the in-process backends' rule,
        `forecasters.backends.base.missing_bos`). A server that does not tokenize chats (not vLLM) gets no field."""
        if self.config.add_special_tokens is not None:
            return self.config.add_special_tokens
        import tenacity

        try:
            return tenacity.Retrying(**self._tenacity_kwargs())(self._ask_bos)
        except ServerHTTPError as e:
            if self.is_transient(e):
                raise
        except (ValueError, KeyError, TypeError, IndexError) as e:  # a 200 that is not vLLM's tokenize answer
            log.info("openai backend: %s does not tokenize chats as vLLM does (%s: %s)", self.config.base_url,
                     type(e).__name__, e)
        return False

    @functools.cached_property
    def engine_version(self) -> str:
        import httpx

        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        try:
            r = self._get(root + "/version", 5.0)
            if r.status_code == 200 and "version" in r.json():
                return f"openai-compatible server {r.json()['version']} (httpx {httpx.__version__})"
        except (httpx.HTTPError, ValueError):
            pass
        return f"openai-compatible server (httpx {httpx.__version__})"

    @property
    def _headers(self) -> dict[str, str]:
        key = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        return {"Content-Type": "application/json", **key}

    # --- the server check ---
    def _get_models(self):
        r = self._get(self.config.base_url.rstrip("/") + "/models", min(self.config.timeout_s, 30.0))
        if r.status_code == 429 or r.status_code >= 500:
            r.raise_for_status()  # transient: retried
        return r

    def preflight(self) -> None:
        """``GET <base_url>/models`` (transient failures retried under the retry policy): raise `ServerUnavailable`
        when no server answers or it refuses the request, `ModelNotFound` when it does not serve the model."""
        import tenacity

        url = self.config.base_url.rstrip("/") + "/models"
        try:
            r = tenacity.Retrying(**self._tenacity_kwargs())(self._get_models)
        except Exception as e:
            raise ServerUnavailable(
                f"no OpenAI-compatible server answers at {self.config.base_url} ({error_kind(e)}: {e}) after "
                f"{self.config.retry.max_attempts} attempt(s)", fix="start the server, or fix --base-url") from None
        if r.status_code in (401, 403):
            raise ServerUnavailable(f"{url} refused the request (HTTP {r.status_code}): {r.text[:200]}",
                                    fix="set the API key in the variable named by --api-key-env")
        try:
            ids = [m["id"] for m in r.json()["data"]] if r.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            ids = None
        if ids is None:
            raise ServerUnavailable(f"{url} answered HTTP {r.status_code} without a model list: {r.text[:120]!r}",
                                    fix="--base-url must be the API root of an OpenAI-compatible server, "
                                        "e.g. http://HOST:8000/v1")
        if self.served_model not in ids:
            flag = "--adapter" if self.config.adapter else "--model"
            raise ModelNotFound(f"{self.config.base_url} does not serve {flag} {self.served_model!r}; it serves {ids}",
                                fix=f"pass {flag} with one of the served names")
        try:
            self.adds_bos  # noqa: B018  (decided once, before the first request)
        except Exception as e:
            raise ServerUnavailable(f"{self.config.base_url} did not tokenize a chat ({error_kind(e)}: {e})",
                                    fix="check the server's log; set add_special_tokens in the backend config to "
                                        "skip the question") from None

    # --- requests ---
    def _ensure_loop(self) -> _Loop:
        with self._lock:
            if self._loop is None:
                self._loop = _Loop(self._make_client, max(1, self.config.concurrency))
            return self._loop

    def _make_client(self):
        import httpx

        n = max(1, self.config.concurrency)
        return httpx.AsyncClient(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                                 timeout=self.config.timeout_s, headers=self._headers)

    def _vllm_fields(self, request: Request) -> dict:
        """vLLM's own request fields of a chat: ``add_special_tokens`` (`adds_bos`) and, for a video, its frame rate in
        ``media_io_kwargs`` (the rate vLLM's loader gives the frames of a ``video/jpeg`` URL, written into the video's
        metadata)."""
        fields = {"add_special_tokens": True} if self._bos_decided() else {}
        if request.videos:
            fields["media_io_kwargs"] = {"video": {"fps": float(request.videos[0].fps)}}
        return fields

    def payload(self, request: Request) -> dict:
        """The request body. Built in the caller's thread: it encodes frames."""
        sp = request.sampling
        kwargs = dict(model=self.served_model, messages=to_openai_messages(request), temperature=sp.temperature,
                      max_tokens=sp.max_tokens, top_p=sp.top_p, n=sp.n)
        if sp.seed is not None:
            kwargs["seed"] = sp.seed
        if sp.stop:
            kwargs["stop"] = list(sp.stop)
        return {**kwargs, **self._vllm_fields(request)}

    def score_payload(self, prompt: Request, answer: str) -> dict:
        """The body of one answer's scoring request (see the module docstring)."""
        messages = to_openai_messages(prompt) + [{"role": "assistant", "content": answer}]
        return dict(model=self.served_model, messages=messages, max_tokens=1, temperature=0.0,
                    add_generation_prompt=False, continue_final_message=True, prompt_logprobs=0,
                    **self._vllm_fields(prompt))

    async def _score_attempt(self, loop: _Loop, body: bytes, request: ScoreRequest) -> ScoreResult:
        async with loop.slots:
            r = await loop.client.post(self._url, content=body)
        if r.status_code != 200:
            raise ServerHTTPError(r)
        return parse_score_body(request.id, r.content, request.continuations[0])

    async def _score_async(self, loop: _Loop, request: ScoreRequest, bodies: list[bytes]) -> ScoreResult:
        """Every answer of ``request`` concurrently (each under the retry policy); the first failure fails it."""
        t0 = time.perf_counter()

        async def one(j: int) -> ScoreResult:
            sub = ScoreRequest(f"{request.id}#{j}", request.prompt, (request.continuations[j],))
            return await self._arun_one(sub, functools.partial(self._score_attempt, loop, bodies[j]))

        parts = await asyncio.gather(*(one(j) for j in range(len(bodies))))
        attempts, latency = max((x.attempts for x in parts), default=1), time.perf_counter() - t0
        bad = next((x for x in parts if not x.ok), None)
        if bad is not None:
            return ScoreResult(request_id=request.id, error=bad.error, error_kind=bad.error_kind, attempts=attempts,
                               latency_s=latency)
        return ScoreResult(request_id=request.id, logprobs=[x.logprobs[0] for x in parts],
                           n_tokens=[x.n_tokens[0] for x in parts],
                           prompt_tokens=parts[0].prompt_tokens if parts else None, attempts=attempts,
                           latency_s=latency)

    def _submit_score(self, loop: _Loop, request: ScoreRequest) -> concurrent.futures.Future | ScoreResult:
        """Start the scoring of a request's answers on the loop; the bodies (frames encoded once) are built here."""
        t0 = time.perf_counter()
        try:
            self.check_supported(request.prompt)
            self.adds_bos  # noqa: B018  (asked of the server once, before the first body is built)
            bodies = [json.dumps(self.score_payload(request.prompt, a), ensure_ascii=False).encode("utf-8")
                      for a in request.continuations]
        except Exception as e:
            return self.failure(request, e, 1, t0)
        return loop.submit(self._score_async(loop, request, bodies))

    def _score_batch(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        loop = self._ensure_loop()
        started = [self._submit_score(loop, r) for r in requests]
        return [s if isinstance(s, ScoreResult) else self._result(s, r) for s, r in zip(started, requests, strict=True)]

    def _score_one(self, request: ScoreRequest) -> ScoreResult:
        return self._score_batch([request])[0]

    def check_scoring(self) -> None:
        """One probe request: raise `ScoringUnsupported` (or `ServerUnavailable`) unless the server answers it with
        prompt log-probabilities (see the module docstring)."""
        probe = ScoreRequest("scoring-probe", Request("scoring-probe", ("Name a state of a ball.",)), ("falling",))
        (res,) = self.score([probe])
        if res.ok and res.n_tokens and res.n_tokens[0] >= 1:
            return
        if error_class(res.error_kind) == "transient":
            raise ServerUnavailable(f"{self.config.base_url} did not answer a scoring probe: {res.error}",
                                    fix="check that the server is up, then rerun")
        raise ScoringUnsupported(
            f"{self.config.base_url} cannot score answers for likelihood: a chat completion with "
            f"continue_final_message and prompt_logprobs was answered with {res.error_kind}: {res.error}",
            fix="serve the model with vLLM (`vllm serve`), or use --backend hf / vllm")

    async def _attempt(self, loop: _Loop, body: bytes, request: Request) -> Completion:
        """One HTTP attempt, holding a concurrency slot only while the request is at the server."""
        async with loop.slots:
            r = await loop.client.post(self._url, content=body)
        if r.status_code != 200:
            raise ServerHTTPError(r)
        return parse_chat_body(request.id, r.content)

    @functools.cached_property
    def _url(self) -> str:
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def _submit(self, loop: _Loop, request: Request) -> concurrent.futures.Future | Completion:
        """Start a request on the loop (retries included); a request that cannot be sent is a failure at once. The
        body (frames as PNG data URLs, JSON) is built here, in the caller's thread."""
        t0 = time.perf_counter()
        try:
            self.check_supported(request)
            self.adds_bos  # noqa: B018  (asked of the server once, before the first body is built)
            body = json.dumps(self.payload(request), ensure_ascii=False).encode("utf-8")
        except Exception as e:
            return self.failure(request, e, 1, t0)
        call = functools.partial(self._attempt, loop, body)
        return loop.submit(self._arun_one(request, call))

    def _result(self, fut: concurrent.futures.Future, request: Request) -> Completion:
        try:
            return fut.result()
        except Exception as e:  # _arun_one records failures itself; this is a last line of defence
            return self.failure(request, e, 0, time.perf_counter())

    def _generate_one(self, request: Request) -> Completion:
        return self._generate_batch([request])[0]

    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        loop = self._ensure_loop()
        started = [self._submit(loop, r) for r in requests]
        return [s if isinstance(s, Completion) else self._result(s, r) for s, r in zip(started, requests, strict=True)]

    def stream(self, items: Iterable[Request | Completion]) -> Iterator[list[Completion]]:
        """Completions as they are answered; at most ``batch_size`` requests admitted ahead (see the module
        docstring). Closing the generator cancels the requests not yet answered."""
        return self._stream(items, self._submit)

    def stream_scores(self, items: Iterable[ScoreRequest | ScoreResult]) -> Iterator[list[ScoreResult]]:
        """`stream` for scoring requests: each result as soon as all its answers are scored."""
        return self._stream(items, self._submit_score)

    def _stream(self, items, submit) -> Iterator[list]:
        loop = self._ensure_loop()
        done: queue.SimpleQueue = queue.SimpleQueue()
        free = threading.Semaphore(max(1, self.config.batch_size))
        pending: dict[concurrent.futures.Future, Request] = {}

        def finished(fut):  # on the loop thread: queue first, then free the slot (the consumer wakes on either)
            done.put(fut)
            free.release()

        def ready(block: bool) -> list[Completion]:
            out = []
            while pending:
                try:
                    fut = done.get(block=block and not out)
                except queue.Empty:
                    break
                out.append(self._result(fut, pending.pop(fut)))
            return out

        try:
            for item in items:
                if isinstance(item, BackendResult):
                    yield [item]
                    continue
                free.acquire()
                started = submit(loop, item)
                if not isinstance(started, concurrent.futures.Future):
                    free.release()
                    yield [started]
                    continue
                pending[started] = item
                started.add_done_callback(finished)
                if got := ready(block=False):
                    yield got
            while pending:
                yield ready(block=True)
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()
