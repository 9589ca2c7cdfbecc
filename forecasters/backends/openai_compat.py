"""The ``openai`` backend: any OpenAI-compatible chat-completions server (``vllm serve``, SGLang, a hosted API).

Requests run concurrently on an async client (at most ``BackendConfig.concurrency`` in flight), each with its own
timeout (``timeout_s``) and the base class's retry policy (the client's own retries are off, so attempts are counted
in one place). Images travel as base64 PNG data URLs (``image_url`` parts), encoded once per frame. The model field
is ``BackendConfig.model`` (the served model name), or ``adapter`` when set (a LoRA adapter the server registered
with ``--lora-modules NAME=PATH``). Video input is not sent over HTTP (servers differ); use ``hf`` or ``vllm``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools

from forecasters.backends.base import Backend, Completion, ImagePart, Request, UnsupportedInput


def to_openai_messages(request: Request) -> list[dict]:
    """The chat messages of a request in the OpenAI schema (images as data-URL ``image_url`` parts)."""
    content: list[dict] = []
    for p in request.parts:
        if isinstance(p, str):
            content.append({"type": "text", "text": p})
        elif isinstance(p, ImagePart):
            content.append({"type": "image_url", "image_url": {"url": p.data_url}})
        else:
            raise UnsupportedInput("the openai backend does not send video input; use the hf or vllm backend")
    msgs = [{"role": "system", "content": request.system}] if request.system else []
    if len(content) == 1 and content[0]["type"] == "text":
        msgs.append({"role": "user", "content": content[0]["text"]})
    else:
        msgs.append({"role": "user", "content": content})
    return msgs


class OpenAIBackend(Backend):
    name = "openai"
    supports_images = True
    supports_video = False

    def __init__(self, config):
        super().__init__(config)
        if not config.base_url:
            raise ValueError("the openai backend needs --base-url (e.g. http://127.0.0.1:8000/v1)")

    @functools.cached_property
    def engine_version(self) -> str:
        import httpx
        import openai

        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        try:
            r = httpx.get(root + "/version", timeout=5.0)
            if r.status_code == 200 and "version" in r.json():
                return f"openai-compatible server {r.json()['version']} (openai-python {openai.__version__})"
        except (httpx.HTTPError, ValueError):
            pass
        return f"openai-compatible server (openai-python {openai.__version__})"

    def _client(self):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.config.base_url, api_key=self.config.api_key or "EMPTY",
                           timeout=self.config.timeout_s, max_retries=0)

    async def _call(self, client, request: Request) -> Completion:
        self.check_supported(request)
        sp = request.sampling
        kwargs = dict(model=self.config.adapter or self.config.model, messages=to_openai_messages(request),
                      temperature=sp.temperature, max_tokens=sp.max_tokens, top_p=sp.top_p, n=sp.n)
        if sp.seed is not None:
            kwargs["seed"] = sp.seed
        if sp.stop:
            kwargs["stop"] = list(sp.stop)
        resp = await client.chat.completions.create(**kwargs)
        choices = sorted(resp.choices, key=lambda c: c.index)
        usage = resp.usage
        return Completion(request_id=request.id, texts=[c.message.content or "" for c in choices],
                          prompt_tokens=getattr(usage, "prompt_tokens", None),
                          completion_tokens=getattr(usage, "completion_tokens", None),
                          finish_reasons=[str(c.finish_reason) for c in choices])

    def _generate_one(self, request: Request) -> Completion:
        return self._generate_batch([request])[0]

    async def _agenerate(self, requests: list[Request]) -> list[Completion]:
        sem = asyncio.Semaphore(max(1, self.config.concurrency))
        async with self._client() as client:
            call = functools.partial(self._call, client)

            async def one(r: Request) -> Completion:
                async with sem:
                    return await self._arun_one(r, call)

            return list(await asyncio.gather(*(one(r) for r in requests)))

    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._agenerate(requests))
        # called from inside an event loop (a notebook): run on a worker thread with its own loop
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, self._agenerate(requests)).result()
