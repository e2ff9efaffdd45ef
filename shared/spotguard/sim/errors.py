"""Kubernetes API errors as exceptions that render as ``kind: Status`` objects."""

from __future__ import annotations

from typing import Any


class StatusError(Exception):
    """An API error: ``code`` (HTTP status), ``reason`` (a Kubernetes StatusReason)."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details)
        self.list_meta: dict[str, Any] = {}  # the Status's metadata (a continue token)

    def status(self) -> dict[str, Any]:
        """The ``kind: Status`` object kube-apiserver would answer with."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def _with(code: int, reason: str) -> dict[str, Any]:
    return {"code": code, "reason": reason}


class NotFound(StatusError):
    code, reason = 404, "NotFound"


class AlreadyExists(StatusError):
    code, reason = 409, "AlreadyExists"


class Conflict(StatusError):
    code, reason = 409, "Conflict"


class Invalid(StatusError):
    code, reason = 422, "Invalid"


class BadRequest(StatusError):
    code, reason = 400, "BadRequest"


class Forbidden(StatusError):
    code, reason = 403, "Forbidden"


class MethodNotAllowed(StatusError):
    code, reason = 405, "MethodNotAllowed"


class NotAcceptable(StatusError):
    code, reason = 406, "NotAcceptable"


class UnsupportedMediaType(StatusError):
    code, reason = 415, "UnsupportedMediaType"


class Gone(StatusError):
    code, reason = 410, "Expired"


class TooManyRequests(StatusError):
    code, reason = 429, "TooManyRequests"


class InternalError(StatusError):
    code, reason = 500, "InternalError"


class ServiceUnavailable(StatusError):
    code, reason = 503, "ServiceUnavailable"


class Timeout(StatusError):
    code, reason = 504, "Timeout"


def not_found(resource: str, name: str, group: str = "") -> NotFound:
    """``pods "web-1" not found`` with the details kube-apiserver sends."""
    qualified = f"{resource}.{group}" if group else resource
    return NotFound(f'{qualified} "{name}" not found', name=name, group=group, kind=resource)


def already_exists(resource: str, name: str, group: str = "") -> AlreadyExists:
    qualified = f"{resource}.{group}" if group else resource
    return AlreadyExists(
        f'{qualified} "{name}" already exists', name=name, group=group, kind=resource
    )


def conflict(resource: str, name: str, group: str = "") -> Conflict:
    qualified = f"{resource}.{group}" if group else resource
    return Conflict(
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        name=name,
        group=group,
        kind=resource,
    )


def invalid(kind: str, name: str, causes: list[dict[str, str]], group: str = "") -> Invalid:
    """A 422 with field causes: ``Pod "x" is invalid: metadata.name: Invalid value...``."""
    text = "; ".join(f"{c.get('field', '')}: {c.get('message', '')}" for c in causes)
    qualified = f"{kind}.{group}" if group else kind
    return Invalid(
        f'{qualified} "{name}" is invalid: {text}',
        name=name,
        group=group,
        kind=kind,
        causes=[{"reason": "FieldValueInvalid", **c} for c in causes],
    )
