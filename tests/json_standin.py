"""A JSON HTTP stand-in on 127.0.0.1 for the openai backend's tests that need no real server (tests only).

``answer(method, path, body)`` returns ``(status, json object)`` for each request (``body``: the parsed JSON of a
POST, None for a GET); every path asked is recorded in ``paths``. Use as a context manager or call `close`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[str, str, dict | None], tuple[int, dict]]


class JSONStandIn:
    def __init__(self, answer: Answer):
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _serve(self, body: dict | None) -> None:
                outer.paths.append(self.path)
                status, obj = answer(self.command, self.path, body)
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve(None)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._serve(json.loads(raw) if raw else {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> JSONStandIn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
