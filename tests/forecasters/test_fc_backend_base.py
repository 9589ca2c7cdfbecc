"""The backend base class: which errors are retried, the backoff schedule, failure records, order."""

from __future__ import annotations

import httpx
import openai
import pytest

from forecasters.backends import Backend, BackendConfig, Completion, Request, RetryPolicy, SamplingParams
from forecasters.backends.base import UnsupportedInput, error_kind


def _status_error(code: int, retry_after: str | None = None) -> openai.APIStatusError:
    req = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    headers = {"retry-after": retry_after} if retry_after else {}
    resp = httpx.Response(code, request=req, headers=headers, json={"error": {"message": "x"}})
    cls = {400: openai.BadRequestError, 429: openai.RateLimitError, 404: openai.NotFoundError}.get(
        code, openai.InternalServerError)
    return cls(f"status {code}", response=resp, body=None)


class Scripted(Backend):
    """A backend whose inner call raises the scripted exceptions of a request, in order, then answers."""

    name = "scripted"

    def __init__(self, script: dict[str, list[BaseException]], **kw):
        super().__init__(BackendConfig(model="none", retry=RetryPolicy(max_attempts=4, wait_initial=0.01,
                                                                         wait_max=0.05), **kw))
        self.script = {k: list(v) for k, v in script.items()}
        self.calls: dict[str, int] = {}

    def _generate_one(self, request: Request) -> Completion:
        self.calls[request.id] = self.calls.get(request.id, 0) + 1
        todo = self.script.get(request.id) or []
        if todo:
            raise todo.pop(0)
        return Completion(request_id=request.id, texts=[f"answer to {request.text}"], prompt_tokens=3,
                          completion_tokens=2)


TIMEOUT = openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1/"))
CONN = openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1/"))


@pytest.mark.parametrize("exc, kind", [(_status_error(500), "http_500"), (_status_error(503), "http_503"),
                                       (_status_error(429), "http_429"), (TIMEOUT, "timeout"), (CONN, "connection"),
                                       (TimeoutError("t"), "timeout"), (ConnectionResetError("r"), "connection")])
def test_transient_errors_are_retried_until_success(exc, kind):
    b = Scripted({"a": [exc, exc]})
    (c,) = b.generate([Request("a", ("q",))])
    assert c.ok and c.attempts == 3 and b.calls["a"] == 3 and c.texts == ["answer to q"]
    assert error_kind(exc) == kind


@pytest.mark.parametrize("exc", [_status_error(400), _status_error(404), ValueError("bad prompt"),
                                 UnsupportedInput("no images here")])
def test_other_errors_are_not_retried_and_are_recorded(exc):
    b = Scripted({"a": [exc]})
    (c,) = b.generate([Request("a", ("q",))])
    assert not c.ok and c.attempts == 1 and b.calls["a"] == 1
    assert c.error.startswith(type(exc).__name__) and c.error_kind == error_kind(exc)


def test_a_request_that_keeps_failing_becomes_a_failure_record_and_the_batch_goes_on():
    b = Scripted({"bad": [_status_error(500)] * 10})
    out = b.generate([Request("x", ("1",)), Request("bad", ("2",)), Request("y", ("3",))])
    assert [c.request_id for c in out] == ["x", "bad", "y"]
    assert out[0].ok and out[2].ok
    assert not out[1].ok and out[1].attempts == 4 and b.calls["bad"] == 4 and out[1].error_kind == "http_500"


def test_backoff_is_full_jitter_capped_and_honours_retry_after():
    b = Scripted({}, seed=1)
    b.config.retry = RetryPolicy(max_attempts=10, wait_initial=1.0, wait_max=8.0)
    waits = {k: [b.backoff_seconds(k) for _ in range(300)] for k in (1, 2, 3, 6)}
    for k, cap in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 8.0)):
        assert min(waits[k]) >= 0 and max(waits[k]) <= cap
        assert max(waits[k]) > 0.8 * cap  # it does use the whole window
    assert b.backoff_seconds(1, _status_error(429, retry_after="5")) >= 5.0
    assert b.backoff_seconds(1, _status_error(429, retry_after="500")) <= 8.0  # capped at wait_max


def test_sampling_params_are_validated():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(n=3, temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    assert SamplingParams(n=3, temperature=0.7).to_dict()["n"] == 3
