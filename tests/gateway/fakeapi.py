"""A scripted Kubernetes API server on loopback: real HTTP(S), answers chosen by each test.

Tests talk to it with the official ``kubernetes`` client through the gateway,
so the wire (paths, query strings, content types, bodies, status codes,
Retry-After, slow answers, dropped connections) is real.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kubernetes import client
from spotguard.gateway import retry


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without answering


Responder = Callable[[Request], Answer]


def status(code: int, reason: str, message: str = "", **extra: Any) -> Answer:
    """A Kubernetes ``Status`` failure answer."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or reason,
        "reason": reason,
        "code": code,
        **extra,
    }
    return Answer(code, body)


class FakeApi:
    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[Request] = []
        self._rules: list[tuple[str, re.Pattern[str], list[Answer] | Responder]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode()
                req = Request(
                    self.command,
                    url.path,
                    dict(parse_qsl(url.query)),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                answer = api._answer(req)
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.drop:
                    self.close_connection = True
                    return
                data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in answer.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def on(self, method: str, path: str, *answers: Answer | Responder) -> None:
        """Answer ``method`` on paths matching ``path`` (a regex, anchored) with these answers
        in turn (the last repeats), or with a function of the request. Later rules win."""
        if len(answers) == 1 and callable(answers[0]):
            rule: list[Answer] | Responder = answers[0]
        else:
            rule = [a for a in answers if isinstance(a, Answer)]
        with self._lock:
            self._rules.insert(0, (method, re.compile(path + "$"), rule))

    def _answer(self, req: Request) -> Answer:
        with self._lock:
            self.requests.append(req)
            for method, pattern, rule in self._rules:
                if method == req.method and pattern.match(req.path):
                    if callable(rule):
                        break
                    return rule.pop(0) if len(rule) > 1 else rule[0]
            else:
                return status(404, "NotFound", f"no rule for {req.method} {req.path}")
        return rule(req)

    def count(self, method: str | None = None, path: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r.method == method) and (path is None or re.match(path + "$", r.path))
            )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


FAST = retry.Policy(attempts=4, deadline=10.0, timeout=2.0, base_delay=0.01, max_delay=0.05)


def api_client(url: str, ca: str | None = None, token: str | None = None) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    if ca:
        configuration.ssl_ca_cert = ca
    if token:
        configuration.api_key = {"BearerToken": f"Bearer {token}", "authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)
