"""An HTTP fault-injection proxy on 127.0.0.1 in front of a real OpenAI-compatible server (tests only).

Each incoming chat completion (``POST .../chat/completions``; the model list and vLLM's ``/tokenize``, which the
openai backend asks before the first request, are forwarded as they are) is matched against `Rule`s in order; the
first rule whose ``match`` substring occurs in the request body (``None`` matches everything) and has ``times`` left
fires its action, else the request is forwarded.
``every=k`` fires on every k-th matching request; ``per_request=k`` on the first k attempts of each distinct request
body, optionally only for bodies selected by ``select=(m, r)`` (``crc32(body) % m == r``): a deterministic storm.

Actions:
- an HTTP status (``"500"``, ``"503"``, ``"429"``, ``"400"``, ``"404"``, ...): answer with that status and an
  OpenAI-style JSON error body (429 carries ``Retry-After: <retry_after>``);
- ``"html"``: answer 200 with an HTML page (``text/html``), as a misconfigured reverse proxy does;
- ``"nochoices"``: answer 200 with a JSON chat completion that has no choices;
- ``"timeout"``: read the request, then hold the connection open for ``hang_s`` seconds without answering;
- ``"drop"``: read the request and close the connection without a response;
- ``"down"``: drop this request and stop listening for ``down_s`` seconds (connection refused), then listen again
  on the same port (a server that dies and comes back); ``down_s=None`` stays down until `up`;
- ``"delay"``: forward after ``delay_s`` seconds.

`ProxyLog` records every request (action, body) so tests can count attempts. One request per connection
(``Connection: close``), which is what a dying server looks like to a client anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import zlib
from dataclasses import dataclass, field

import httpx


@dataclass
class Rule:
    action: str
    match: str | None = None
    times: int = 1
    every: int = 0  # with every=k > 0: fire on every k-th matching request (times is ignored)
    per_request: int = 0  # with per_request=k > 0: fire on the first k attempts of each distinct body (times ignored)
    select: tuple[int, int] | None = None  # (m, r): only bodies with crc32(body) % m == r
    retry_after: float = 0.0
    hang_s: float = 30.0
    down_s: float | None = 1.0
    delay_s: float = 0.0
    _seen: int = 0
    _per_body: dict = field(default_factory=dict)


@dataclass
class ProxyLog:
    entries: list[tuple[float, str, str]] = field(default_factory=list)  # (time, action, body)

    def count(self, needle: str | None = None, action: str | None = None) -> int:
        return sum(1 for _, a, b in self.entries
                   if (needle is None or needle in b) and (action is None or a == action))


_REASONS = {400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}
_HTML = b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"
_NO_CHOICES = json.dumps({"id": "cmpl-x", "object": "chat.completion", "created": 0, "model": "tiny-vl",
                          "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}})


class FaultProxy:
    def __init__(self, upstream: str, port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.port = port
        self.rules: list[Rule] = []
        self.log = ProxyLog()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

    # --- lifecycle ---
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def main():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._client = httpx.AsyncClient(timeout=120.0)
            self._loop.run_until_complete(self._listen())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True, name="fault-proxy")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def down(self) -> None:
        """Stop listening (new connections are refused)."""
        asyncio.run_coroutine_threadsafe(self._close_listener(), self._loop).result(10)

    def up(self) -> None:
        """Listen again on the same port."""
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._close_listener(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- rules ---
    def add(self, action: str, match: str | None = None, **kw) -> Rule:
        r = Rule(action=action, match=match, **kw)
        with self._lock:
            self.rules.append(r)
        return r

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _pick(self, body: str) -> Rule | None:
        with self._lock:
            for r in self.rules:
                if r.match is not None and r.match not in body:
                    continue
                if r.select is not None and zlib.crc32(body.encode()) % r.select[0] != r.select[1]:
                    continue
                if r.per_request:
                    n = r._per_body.get(body, 0)
                    if n < r.per_request:
                        r._per_body[body] = n + 1
                        return r
                    continue
                if r.every:
                    r._seen += 1
                    if r._seen % r.every == 0:
                        return r
                    continue
                if r.times > 0:
                    r.times -= 1
                    return r
        return None

    # --- serving ---
    async def _read_request(self, reader) -> tuple[str, str, dict, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for ln in lines[1:]:
            if ":" in ln:
                k, v = ln.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        return method, path, headers, body

    @staticmethod
    async def _respond(writer, status: int, body: bytes, headers: dict | None = None) -> None:
        hdrs = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
                **(headers or {})}
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        writer.write(head.encode("latin-1") + b"\r\n" + body)
        await writer.drain()

    async def _handle(self, reader, writer) -> None:
        try:
            try:
                method, path, headers, body = await self._read_request(reader)
            except (asyncio.IncompleteReadError, ValueError, ConnectionError):
                return
            text = body.decode("utf-8", errors="replace")
            rule = self._pick(text) if method == "POST" and path.endswith("/chat/completions") else None
            action = rule.action if rule else "pass"
            self.log.entries.append((time.monotonic(), action, text))
            if action.isdigit():
                extra = {"retry-after": f"{rule.retry_after:g}"} if action == "429" else {}
                msg = json.dumps({"error": {"message": f"injected {action}", "type": "injected", "code": int(action)}})
                await self._respond(writer, int(action), msg.encode(), extra)
                return
            if action == "html":
                await self._respond(writer, 200, _HTML, {"content-type": "text/html"})
                return
            if action == "nochoices":
                await self._respond(writer, 200, _NO_CHOICES.encode())
                return
            if action == "timeout":
                await asyncio.sleep(rule.hang_s)
                return
            if action == "drop":
                return
            if action == "down":
                await self._close_listener()
                if rule.down_s is not None:
                    self._loop.call_later(rule.down_s, lambda: asyncio.ensure_future(self._listen()))
                return
            if action == "delay":
                await asyncio.sleep(rule.delay_s)
            fwd = {k: v for k, v in headers.items() if k not in ("host", "content-length", "connection")}
            r = await self._client.request(method, self.upstream + path, content=body, headers=fwd)
            out = r.content
            keep = {k: v for k, v in r.headers.items() if k.lower() in ("content-type",)}
            await self._respond(writer, r.status_code, out, keep)
        except (ConnectionError, httpx.HTTPError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
