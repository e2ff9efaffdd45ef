"""The admission webhook as an AWS Lambda behind a Function URL (payload format 2.0).

Handler: ``lambda_function.lambda_handler``. The Function URL event carries the
HTTP request (``requestContext.http.method``, ``rawPath``, ``body``,
``isBase64Encoded``); the answer is ``{"statusCode", "headers", "body"}`` with
the AdmissionReview response. The context (API connection, caches) lives in
the module, so a warm execution environment reuses it. The cluster is reached
with an EKS token when ``SPOTGUARD_EKS_CLUSTER`` is set.

The path starts with the webhook secret (``/<secret>/mutate``;
:mod:`spotguard.admission.callers`): a call without it is answered 404 before
the cluster is touched.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from typing import Any

from spotguard import emf, logs
from spotguard.admission import callers, core, errors, transport

logs.configure()  # at import, before any line: every line as JSON, through the runtime's handler
_state: dict[str, core.Context] = {}
_lock = threading.Lock()
_gate = callers.Cached()  # read on first use: its warning logs through the formatter configured above


def _context() -> core.Context:
    with _lock:
        if "ctx" not in _state:
            _state["ctx"] = core.context_from_env()
        return _state["ctx"]


def _body(event: dict[str, Any]) -> bytes:
    raw = event.get("body") or ""
    if not isinstance(raw, str):
        raise errors.NotJSON("the event body must be a string")
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise errors.NotJSON("the body is not valid base64") from None
    return raw.encode("utf-8", "surrogatepass")


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    http = _field(_field(event, "requestContext"), "http")
    method = str(_field(http, "method") or "POST")
    raw_path = str(_field(event, "rawPath") or _field(http, "path") or "/")
    try:
        gate = _gate.get()
    except (callers.SecretUnavailable, ValueError) as exc:
        logging.getLogger("spotguard.admission").error(
            "cannot check the caller: answering 503", extra={"error": str(exc)}
        )
        status, headers, payload = transport.json_answer(503, {"error": "unavailable", "code": 503})
        return _answer(status, headers, payload)
    path = gate.admit(raw_path)
    try:
        if path is None:
            raise errors.NotFound("no such path")
        if not isinstance(event, dict):
            raise errors.WrongType("the event must be a Function URL request (payload format 2.0)")
        body = _body(event)
    except errors.WebhookError as exc:
        status, headers, payload = transport.error_answer(exc)
    else:
        status, headers, payload = transport.handle(method, path, body, _context())
    return _answer(status, headers, payload)


def _answer(status: int, headers: dict[str, str], payload: bytes) -> dict[str, Any]:
    text = payload.decode("utf-8", "replace")
    return {"statusCode": status, "headers": headers, "body": text, "isBase64Encoded": False}


# CloudWatch metrics (EMF) around every invocation: spotguard.emf.
lambda_handler = emf.instrument("admission", emf.admission_review)(handle)
