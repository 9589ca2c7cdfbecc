"""The backend base class: which errors are retried, the backoff schedule, failure records, order; error classes
and the runner's early-stop rule."""

from __future__ import annotations

import httpx
import openai
import pytest

from forecasters.backends import Backend, BackendConfig, Completion, Request, RetryPolicy, SamplingParams
from forecasters.backends.base import BadResponse, UnsupportedInput, error_class, error_kind, retry_after_seconds
from forecasters.backends.openai_compat import ServerHTTPError, parse_chat_body
from forecasters.runner import NO_ANSWER_LIMIT, REJECTED_IN_A_ROW, StopRule


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


@pytest.mark.parametrize("kind, cls", [
    ("timeout", "transient"), ("connection", "transient"), ("bad_response", "transient"), ("http_429", "transient"),
    ("http_500", "transient"), ("http_502", "transient"), ("http_504", "transient"), ("http_404", "fatal"),
    ("http_401", "fatal"), ("http_403", "fatal"), ("http_400", "rejected"), ("http_413", "rejected"),
    ("http_422", "rejected"), ("unsupported", "rejected"), ("exception", "rejected"), ("input", "input")])
def test_error_classes(kind, cls):
    assert error_class(kind) == cls


@pytest.mark.parametrize("body", [
    b"<html><body>502 Bad Gateway</body></html>", b"", b'{"id": "x", "choices": []}', b'{"id": "x"}', b"[1, 2]",
    b'{"choices": [{"index": 0, "text": "a legacy completion"}]}'])
def test_a_200_that_is_not_a_chat_completion_is_a_retried_server_error(body):
    with pytest.raises(BadResponse, match="answered 200"):
        parse_chat_body("a", body)
    b = Scripted({"a": [BadResponse("html"), BadResponse("no choices")]})
    (c,) = b.generate([Request("a", ("q",))])
    assert c.ok and c.attempts == 3
    b = Scripted({"a": [BadResponse("html")] * 9})
    (c,) = b.generate([Request("a", ("q",))])
    assert not c.ok and c.error_kind == "bad_response" and c.attempts == 4  # an error: --redo-failed redoes it


def _failed(kind: str) -> Completion:
    return Completion(request_id="q", error=f"{kind} happened", error_kind=kind)


OK = Completion(request_id="q", texts=["ok"])


def test_stop_rule_stops_at_once_on_a_fatal_error():
    rule = StopRule(max_transient=100)
    assert rule.update(OK) is None
    assert "http_404" in rule.update(_failed("http_404"))


def test_stop_rule_stops_after_a_run_of_rejected_requests():
    rule = StopRule(max_transient=100)
    rule.update(OK)
    reasons = [rule.update(_failed("http_400")) for _ in range(REJECTED_IN_A_ROW)]
    assert reasons[:-1] == [None] * (REJECTED_IN_A_ROW - 1) and "rejected" in reasons[-1]
    rule = StopRule(max_transient=100)  # an answer in between resets the run; input errors count for nothing
    for _ in range(3):
        assert rule.update(OK) is None
        for _ in range(REJECTED_IN_A_ROW - 1):
            assert rule.update(_failed("http_400")) is None and rule.update(_failed("input")) is None


def test_stop_rule_stops_small_jobs_that_never_got_an_answer():
    rule = StopRule(max_transient=100)
    reasons = [rule.update(_failed("connection")) for _ in range(NO_ANSWER_LIMIT)]
    assert reasons[:-1] == [None] * (NO_ANSWER_LIMIT - 1) and "first 8 requests all failed" in reasons[-1]
    rule = StopRule(max_transient=20)  # once something was answered, the long rule applies
    rule.update(OK)
    reasons = [rule.update(_failed("http_503")) for _ in range(20)]
    assert reasons[:-1] == [None] * 19 and "20 failures in a row" in reasons[-1]


def test_stream_passes_prebuilt_failures_through_and_answers_each_request_once():
    b = Scripted({}, batch_size=3)
    items = [Request(f"r{i}", (f"q{i}",)) for i in range(7)]
    items.insert(2, _failed("input"))
    groups = list(b.stream(iter(items)))
    ids = [c.request_id for g in groups for c in g]
    assert sorted(ids) == sorted([f"r{i}" for i in range(7)] + ["q"]) and len(ids) == 8
    assert [len(g) for g in groups] == [1, 3, 3, 1]  # the failure at once, then chunks of batch_size


def test_a_chat_completion_body_and_an_error_status_are_read_as_the_server_wrote_them():
    body = (b'{"choices": [{"index": 1, "message": {"content": "b"}, "finish_reason": "length"}, '
            b'{"index": 0, "message": {"content": "a"}, "finish_reason": "stop"}], '
            b'"usage": {"prompt_tokens": 7, "completion_tokens": 3}}')
    c = parse_chat_body("q", body)
    assert (c.texts, c.finish_reasons, c.prompt_tokens, c.completion_tokens) == (["a", "b"], ["stop", "length"], 7, 3)
    req = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    e = ServerHTTPError(httpx.Response(404, request=req, json={"error": {"message": "The model `m3` does not exist."}}))
    assert str(e) == "HTTP 404: The model `m3` does not exist." and error_kind(e) == "http_404"
    e = ServerHTTPError(httpx.Response(429, request=req, headers={"retry-after": "2"}, text="slow down"))
    assert str(e) == "HTTP 429: slow down" and retry_after_seconds(e) == 2.0


def test_each_backend_takes_its_own_config():
    from forecasters.backends import BACKENDS, backend_class, config_for
    from forecasters.backends.hf import HFConfig
    from forecasters.backends.openai_compat import OpenAIConfig
    from forecasters.backends.vllm_backend import VLLMConfig

    assert {n: backend_class(n).config_class for n in BACKENDS} == {"hf": HFConfig, "vllm": VLLMConfig,
                                                                    "openai": OpenAIConfig}
    opts = dict(model="m", batch_size=3, dtype="float32", tensor_parallel_size=2, base_url="http://x/v1")
    hf, vllm, http = (config_for(n, **opts) for n in ("hf", "vllm", "openai"))
    assert type(hf) is HFConfig and hf.dtype == "float32" and not hasattr(hf, "tensor_parallel_size")
    assert type(vllm) is VLLMConfig and vllm.tensor_parallel_size == 2 and not hasattr(vllm, "base_url")
    assert type(http) is OpenAIConfig and http.base_url == "http://x/v1" and not hasattr(http, "dtype")
    assert hf.batch_size == vllm.batch_size == http.batch_size == 3
    with pytest.raises(TypeError, match="no backend takes"):
        config_for("hf", model="m", tensor_parallel=2)
    with pytest.raises(TypeError, match="needs its config class OpenAIConfig"):
        backend_class("openai")(BackendConfig(model="m"))
    assert "api_key" not in OpenAIConfig(model="m", api_key="secret").to_dict()
