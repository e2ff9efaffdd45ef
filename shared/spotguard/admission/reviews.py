"""AdmissionReview ``admission.k8s.io/v1`` wire formats, typed at the edge.

Only the fields spotguard reads or writes are spelled out; the API server
sends more (``userInfo``, ``options``, ``requestKind``...) and they pass
through untouched. See the ``admission.k8s.io/v1`` API reference.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
PatchType = Literal["JSONPatch"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class Request(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: Operation
    userInfo: NotRequired[dict[str, Any]]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class Review(TypedDict):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: Request


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str
    details: dict[str, Any]  # e.g. retryAfterSeconds (the Retry-After header of the answer)


class Response(TypedDict):
    uid: str
    allowed: bool
    patchType: NotRequired[PatchType]
    patch: NotRequired[str]  # base64 of the JSON-encoded RFC 6902 patch
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]
    status: NotRequired[Status]


class ResponseReview(TypedDict):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    response: Response


class ErrorBody(TypedDict):
    """The JSON answer to a request that is not an AdmissionReview at all (HTTP 4xx)."""

    error: str
    reason: str
    code: int
