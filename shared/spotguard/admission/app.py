"""The Flask app: ``POST /mutate``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

A thin adapter over :mod:`spotguard.admission.transport`; the body is read with
a cap (:data:`transport.MAX_BODY`) and every error is a JSON answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import flask
from werkzeug.exceptions import HTTPException

from spotguard.admission import core, deadline, errors, transport

DRAIN_LIMIT = 16 * 1024 * 1024


def _drain(stream: Any, length: int) -> None:
    left = min(length, DRAIN_LIMIT)
    while left > 0:
        chunk = stream.read(min(left, 65536))
        if not chunk:
            return
        left -= len(chunk)


class _App(flask.Flask):
    def handle_exception(self, e: Exception) -> Any:
        """A connection error while reading the request (the client reset it, or stalled past
        the client limit and was dropped) is passed to the server, which closes the
        connection: there is no one to answer, and certainly not with a 500."""
        if isinstance(e, ConnectionError):
            raise e
        return super().handle_exception(e)


def create_app(context: core.Context | Callable[[], core.Context]) -> flask.Flask:
    """``context`` may be a factory: it is then called once, on the first request
    (after gunicorn forks its workers, so each worker has its own connection)."""
    app = _App("spotguard.admission")
    state: dict[str, core.Context] = {}
    lock = threading.Lock()

    def ctx() -> core.Context:
        with lock:
            if "ctx" not in state:
                state["ctx"] = context() if callable(context) else context
            return state["ctx"]

    if callable(context):
        # Connect (and warm the caches) now, in this worker, not on the first review.
        threading.Thread(target=ctx, name="spotguard-admission-connect", daemon=True).start()

    def respond(status: int, headers: dict[str, str], body: bytes) -> flask.Response:
        return flask.Response(body, status=status, headers=headers)

    @app.route("/", defaults={"path": ""}, methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"])
    @app.route("/<path:path>", methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"])
    def route(path: str) -> flask.Response:
        request = flask.request
        if request.method == "POST":
            length = request.content_length
            if length is not None and length > transport.MAX_BODY:
                _drain(request.stream, length)  # so the client reads our answer, not a reset
                status, headers, body = transport.error_answer(errors.BodyTooLarge(f"the body is {length} bytes"))
                return respond(status, {**headers, "Connection": "close"}, body)
            body = request.stream.read(transport.MAX_BODY + 1)
            if len(body) > transport.MAX_BODY:  # a chunked body over the cap: answered 413
                _drain(request.stream, DRAIN_LIMIT)  # (the rest read, as above, so no reset)
        else:
            if request.content_length:  # a GET with a body: read it, or the client gets a reset, not our 405
                _drain(request.stream, request.content_length)
            body = b""
        # The review's deadline counts from when the server saw the request (the gunicorn
        # worker marks it) and stays inside the caller's own timeout (kube-apiserver's ?timeout=).
        seen = deadline.arrival()
        timeout = deadline.parse_timeout(request.args.get("timeout"))
        with deadline.arrived(seen.at if seen is not None else None, timeout):
            return respond(*transport.handle(request.method, "/" + path, body, ctx()))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> flask.Response:
        code = exc.code or 400
        if code >= 500:
            code = 400
        err = errors.WebhookError(exc.description or exc.name)
        err.code, err.reason = code, exc.name.replace(" ", "")
        return respond(*transport.error_answer(err))

    return app
