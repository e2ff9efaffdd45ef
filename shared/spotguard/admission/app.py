"""The Flask app: ``POST /mutate``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

A thin adapter over :mod:`spotguard.admission.transport`; the body is read with
a cap (:data:`transport.MAX_BODY`) and every error is a JSON answer.
"""

from __future__ import annotations

from collections.abc import Callable

import flask
from werkzeug.exceptions import HTTPException

from spotguard.admission import core, errors, transport


def create_app(context: core.Context | Callable[[], core.Context]) -> flask.Flask:
    """``context`` may be a factory: it is then called once, on the first request
    (after gunicorn forks its workers, so each worker has its own connection)."""
    app = flask.Flask("spotguard.admission")
    app.config["MAX_CONTENT_LENGTH"] = transport.MAX_BODY
    state: dict[str, core.Context] = {}

    def ctx() -> core.Context:
        if "ctx" not in state:
            state["ctx"] = context() if callable(context) else context
        return state["ctx"]

    def respond(status: int, headers: dict[str, str], body: bytes) -> flask.Response:
        return flask.Response(body, status=status, headers=headers)

    @app.route("/", defaults={"path": ""}, methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"])
    @app.route("/<path:path>", methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"])
    def route(path: str) -> flask.Response:
        request = flask.request
        if request.method == "POST":
            length = request.content_length
            if length is not None and length > transport.MAX_BODY:
                return respond(*transport.error_answer(errors.BodyTooLarge(f"the body is {length} bytes")))
            body = request.stream.read(transport.MAX_BODY + 1)
        else:
            body = b""
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
