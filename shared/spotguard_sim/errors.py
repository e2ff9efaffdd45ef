"""Kubernetes API errors as exceptions that render as ``kind: Status`` objects.

The constructors below build the bodies kube-apiserver builds, after
k8s.io/apimachinery ``pkg/api/errors/errors.go`` (read at kubernetes/apimachinery
eed236ceee2c19c2753a3d93ac0631dc20750454): ``not_found`` is NewNotFound, ``already_exists``
NewAlreadyExists, ``conflict`` NewConflict, ``invalid`` NewInvalid, ``forbidden``
NewForbidden, ``too_many_requests`` NewTooManyRequests, ``timeout`` NewTimeoutError,
``internal_error`` NewInternalError, ``generic`` NewGenericServerResponse (go-restful's own
404 and 405). A Status is written as ``metav1.Status`` is by encoding/json
(``pkg/apis/meta/v1/types.go``): its fields in declaration order, every one ``omitempty``
but ``metadata`` (a struct, so ``{}``); ``details`` is sent (``{}`` when empty) exactly when
upstream's constructor sets it.
"""

from __future__ import annotations

from typing import Any

# StatusDetails' and StatusCause's fields in the order encoding/json writes them
_DETAIL_KEYS = ("name", "group", "kind", "uid", "causes", "retryAfterSeconds")
_CAUSE_KEYS = ("reason", "message", "field")
# field.ErrorType: the text ErrorBody starts with, and the cause's reason
# (apimachinery pkg/util/validation/field/errors.go)
_CAUSE_TYPES = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Invalid value", "FieldValueInvalid"),
    ("Forbidden", "FieldValueForbidden"),
    ("Not found", "FieldValueNotFound"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Too few", "FieldValueTooFew"),
    ("Too short", "FieldValueTooShort"),
    ("Internal error", "InternalError"),
)
DEFAULT_CONFLICT = ("the object has been modified; please apply your changes to the latest "
                    "version and try again")
NOT_FOUND_PATH = "the server could not find the requested resource"
METHOD_NOT_ALLOWED = "the server does not allow this method on the requested resource"


class StatusError(Exception):
    """An API error: ``code`` (HTTP status), ``reason`` (a Kubernetes StatusReason).

    ``details`` holds StatusDetails' fields; ``with_details`` says whether the Status
    carries a ``details`` object even when they are all empty (upstream's constructors
    that set ``Details`` do: NotFound, AlreadyExists, Conflict, Invalid, Forbidden,
    MethodNotAllowed, TooManyRequests, Timeout, InternalError)."""

    code = 500
    reason = "InternalError"
    with_details = False

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
        }
        if self.message:
            out["message"] = self.message
        if self.reason:
            out["reason"] = self.reason
        details = _details(self.details)
        if details or self.with_details:
            out["details"] = details
        if self.code:
            out["code"] = self.code
        return out


def _details(raw: dict[str, Any]) -> dict[str, Any]:
    """StatusDetails as encoding/json writes them: known fields in order, empty ones left out
    (any other key after them)."""
    out = {k: raw[k] for k in _DETAIL_KEYS if raw.get(k)}
    if out.get("causes"):
        out["causes"] = [_cause(c) for c in out["causes"]]
    out.update((k, v) for k, v in raw.items() if k not in _DETAIL_KEYS and v not in (None, "", [], {}))
    return out


def _cause(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: raw[k] for k in _CAUSE_KEYS if raw.get(k)}
    out.update((k, v) for k, v in raw.items() if k not in _CAUSE_KEYS)
    return out


class NotFound(StatusError):
    code, reason, with_details = 404, "NotFound", True


class AlreadyExists(StatusError):
    code, reason, with_details = 409, "AlreadyExists", True


class Conflict(StatusError):
    code, reason, with_details = 409, "Conflict", True


class Invalid(StatusError):
    code, reason, with_details = 422, "Invalid", True


class BadRequest(StatusError):
    code, reason = 400, "BadRequest"


class Forbidden(StatusError):
    code, reason, with_details = 403, "Forbidden", True


class MethodNotAllowed(StatusError):
    code, reason, with_details = 405, "MethodNotAllowed", True


class NotAcceptable(StatusError):
    code, reason = 406, "NotAcceptable"


class UnsupportedMediaType(StatusError):
    code, reason = 415, "UnsupportedMediaType"


class Gone(StatusError):
    """410 Expired: NewResourceExpired (no details)."""

    code, reason = 410, "Expired"


class TooManyRequests(StatusError):
    code, reason, with_details = 429, "TooManyRequests", True


class InternalError(StatusError):
    code, reason, with_details = 500, "InternalError", True


class ServiceUnavailable(StatusError):
    code, reason = 503, "ServiceUnavailable"


class Timeout(StatusError):
    code, reason, with_details = 504, "Timeout", True


def _qualified(resource: str, group: str) -> str:
    """schema.GroupResource.String(): ``deployments.apps``, ``pods``."""
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> NotFound:
    """NewNotFound: ``pods "web-1" not found``, details name, group, kind (the plural)."""
    return NotFound(f'{_qualified(resource, group)} "{name}" not found', name=name, group=group, kind=resource)


def already_exists(resource: str, name: str, group: str = "") -> AlreadyExists:
    """NewAlreadyExists: ``pods "web-1" already exists``."""
    return AlreadyExists(f'{_qualified(resource, group)} "{name}" already exists', name=name, group=group,
                         kind=resource)


def conflict(resource: str, name: str, group: str = "", err: str = DEFAULT_CONFLICT) -> Conflict:
    """NewConflict: ``Operation cannot be fulfilled on deployments.apps "web": <err>`` (err:
    by default the storage layer's stale-resourceVersion text)."""
    return Conflict(f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {err}',
                    name=name, group=group, kind=resource)


def forbidden(resource: str, name: str, err: str, group: str = "") -> Forbidden:
    """NewForbidden: ``pods "p" is forbidden: <err>``; ``<plural> is forbidden`` without a name,
    ``forbidden: <err>`` without a resource."""
    if not resource and not group:
        message = f"forbidden: {err}"
    elif not name:
        message = f"{_qualified(resource, group)} is forbidden: {err}"
    else:
        message = f'{_qualified(resource, group)} "{name}" is forbidden: {err}'
    return Forbidden(message, name=name, group=group, kind=resource)


def cause_reason(message: str) -> str:
    """The field.ErrorType a cause's message (ErrorBody) starts with."""
    return next((reason for text, reason in _CAUSE_TYPES if message.startswith(text)), "FieldValueInvalid")


def invalid(kind: str, name: str, causes: list[dict[str, str]], group: str = "") -> Invalid:
    """NewInvalid: ``Pod "x" is invalid: <causes>`` with the field causes (``field``,
    ``message`` the ErrorBody, ``reason`` its field.ErrorType unless given). The causes
    aggregate as field.ErrorList.ToAggregate does: duplicates dropped, one as it is, more
    in ``[a, b]``."""
    texts: list[str] = []
    for c in causes:
        text = f"{c.get('field', '')}: {c.get('message', '')}"
        if text not in texts:
            texts.append(text)
    qualified = f"{kind}.{group}" if group else kind
    message = f'{qualified} "{name}" is invalid'
    if texts:
        message += f": {texts[0]}" if len(texts) == 1 else f": [{', '.join(texts)}]"
    return Invalid(message, name=name, group=group, kind=kind,
                   causes=[{"reason": c.get("reason") or cause_reason(str(c.get("message", ""))), **c}
                           for c in causes])


def too_many_requests(message: str, retry_after_seconds: int = 0,
                      causes: list[dict[str, str]] | None = None) -> TooManyRequests:
    """NewTooManyRequests: details carry ``retryAfterSeconds`` (sent as Retry-After too) when
    above 0."""
    return TooManyRequests(message, causes=list(causes or []), retryAfterSeconds=retry_after_seconds)


def timeout(message: str, retry_after_seconds: int, causes: list[dict[str, str]] | None = None) -> Timeout:
    """NewTimeoutError: ``Timeout: <message>``."""
    return Timeout(f"Timeout: {message}", causes=list(causes or []), retryAfterSeconds=retry_after_seconds)


def internal_error(err: str) -> InternalError:
    """NewInternalError: ``Internal error occurred: <err>``, the error as the one cause."""
    return InternalError(f"Internal error occurred: {err}", causes=[{"message": err}])


def generic_not_found() -> NotFound:
    """go-restful's 404 (no route for the path) through NewGenericServerResponse."""
    return NotFound(NOT_FOUND_PATH)


def generic_method_not_allowed() -> MethodNotAllowed:
    """go-restful's 405 (the path's routes lack the method) through NewGenericServerResponse."""
    return MethodNotAllowed(METHOD_NOT_ALLOWED)


def generic_invalid() -> Invalid:
    """NewGenericServerResponse(422): what a JSON patch that cannot apply gets (apiserver
    ``pkg/endpoints/handlers/patch.go`` applyJSPatch; the patch library's error is not sent)."""
    return Invalid("the server rejected our request due to an error in our request")
