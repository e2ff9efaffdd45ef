"""The gateway's error family: every failure talking to Kubernetes is an :class:`ApiError`.

=====================  ======  ==================================================
class                  status  meaning
=====================  ======  ==================================================
``NotFound``           404     the object (or its namespace) does not exist
``Conflict``           409     stale ``resourceVersion``: re-read and try again
``AlreadyExists``      409     create of a name that exists (reason AlreadyExists)
``Gone``               410     expired ``continue`` token or resourceVersion
``Invalid``            422     the server rejected the object (``details.causes``)
``TooManyRequests``    429     throttled, or an eviction a PodDisruptionBudget
                               blocks; ``retry_after`` holds the server's hint
``Transient``          5xx/0   server error, timeout or connection failure that
                               outlived the retries (status 0: no HTTP answer)
``BadRequest``         400
``Unauthorized``       401
``Forbidden``          403     RBAC said no
=====================  ======  ==================================================

``AlreadyExists`` and ``Conflict`` are siblings (both 409), so ``except Conflict``
around an update never swallows a create's name clash. ``TooManyRequests`` is
not a ``Transient``; :data:`RETRY_LATER` groups the two for callers that just
want "try again later".
"""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    """A failed Kubernetes API request, with the parsed ``Status`` when there was one."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: dict[str, Any] = body or {}
        self.retry_after = retry_after

    @property
    def causes(self) -> list[dict[str, Any]]:
        """``details.causes`` of the Status (field errors of a 422, the PDB of a 429 eviction)."""
        details = self.body.get("details") or {}
        causes = details.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class Gone(ApiError):
    pass


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    @property
    def refused(self) -> bool:
        """An eviction refused on purpose: a PodDisruptionBudget (``details.causes`` reason
        ``DisruptionBudget``, or upstream's message) or a validating webhook's denial, not the
        API server throttling (API Priority and Fairness, max-requests-inflight), which
        passes on its own and is worth another try soon."""
        if any(c.get("reason") == "DisruptionBudget" for c in self.causes):
            return True
        text = self.message.lower()
        return "disruption budget" in text or "admission webhook" in text


class Transient(ApiError):
    """5xx, timeout or connection failure (status 0) after the retries ran out."""


RETRY_LATER: tuple[type[ApiError], ...] = (Transient, TooManyRequests)

_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def parse_status(raw: bytes | str | None) -> dict[str, Any]:
    """The ``Status`` object in an error body, or ``{}`` when the body is not one."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def parse_retry_after(value: str | None) -> float | None:
    """The ``Retry-After`` header in seconds (kube-apiserver sends whole seconds)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date; Kubernetes does not send those
    return max(0.0, seconds)


def from_response(
    status: int,
    raw_body: bytes | str | None,
    http_reason: str = "",
    retry_after_header: str | None = None,
) -> ApiError:
    """Map an HTTP error answer to the error class for its status and ``Status.reason``."""
    body = parse_status(raw_body)
    reason = str(body.get("reason") or http_reason or "Unknown")
    message = str(body.get("message") or _snippet(raw_body) or http_reason or "no message")
    retry_after = parse_retry_after(retry_after_header)
    if retry_after is None:
        hint = (body.get("details") or {}).get("retryAfterSeconds")
        if isinstance(hint, int | float) and not isinstance(hint, bool):
            retry_after = float(hint)
    cls: type[ApiError]
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif status >= 500:
        cls = Transient
    else:
        cls = _BY_STATUS.get(status, ApiError)
    return cls(status, reason, message, body, retry_after=retry_after)


def _snippet(raw: bytes | str | None) -> str:
    if not raw:
        return ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text.strip()[:200]
