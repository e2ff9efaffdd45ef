"""The malformed-request family: what cannot be answered with an AdmissionReview.

A request that is a valid AdmissionReview but not ours (another resource,
another operation) is not an error: it is allowed without a patch. Only
input that cannot be read as an AdmissionReview raises :class:`WebhookError`,
which the HTTP adapters turn into a 4xx JSON answer (never a 5xx, never a
denial: with ``failurePolicy: Ignore`` the API server admits the pod).
"""

from __future__ import annotations

from spotguard.admission import reviews


class WebhookError(Exception):
    """A request that is not a readable AdmissionReview. ``code`` is the HTTP status."""

    code = 400
    reason = "BadRequest"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> reviews.ErrorBody:
        return {"error": self.message, "reason": self.reason, "code": self.code}


class NotJSON(WebhookError):
    reason = "NotJSON"


class WrongType(WebhookError):
    """Not an ``admission.k8s.io/v1`` ``AdmissionReview``."""

    reason = "WrongType"


class MissingRequest(WebhookError):
    reason = "MissingRequest"


class MissingObject(WebhookError):
    reason = "MissingObject"


class BodyTooLarge(WebhookError):
    code = 413
    reason = "BodyTooLarge"


class UnsupportedMediaType(WebhookError):
    code = 415
    reason = "UnsupportedMediaType"


class MethodNotAllowed(WebhookError):
    code = 405
    reason = "MethodNotAllowed"


class NotFound(WebhookError):
    code = 404
    reason = "NotFound"
