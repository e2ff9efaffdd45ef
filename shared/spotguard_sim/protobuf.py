"""Protobuf request bodies for the kinds kubectl sends only as protobuf: the access
reviews (``kubectl auth can-i``, ``auth whoami``) and TokenRequest (``kubectl create token``).

The envelope is kube-apiserver's (``staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf``):
the magic ``k8s\\0`` then a ``runtime.Unknown`` (1 typeMeta {1 apiVersion, 2 kind}, 2 raw);
the fields are those of ``k8s.io/api/{authorization,authentication}/v1/generated.proto``.
Responses stay JSON, which client-go decodes by their Content-Type.
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import errors

MAGIC = b"k8s\x00"
# message name -> field number -> (json name, type, repeated); a type is "string", "int",
# "bytes" or another message's name
Schema = dict[int, tuple[str, str, bool]]
MESSAGES: dict[str, Schema] = {
    "Unknown": {1: ("typeMeta", "TypeMeta", False), 2: ("raw", "bytes", False)},
    "TypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "ResourceAttributes": {1: ("namespace", "string", False), 2: ("verb", "string", False),
                           3: ("group", "string", False), 4: ("version", "string", False),
                           5: ("resource", "string", False), 6: ("subresource", "string", False),
                           7: ("name", "string", False)},
    "NonResourceAttributes": {1: ("path", "string", False), 2: ("verb", "string", False)},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes", False),
                                    2: ("nonResourceAttributes", "NonResourceAttributes", False)},
    "SubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes", False),
                                2: ("nonResourceAttributes", "NonResourceAttributes", False),
                                3: ("user", "string", False), 4: ("groups", "string", True),
                                6: ("uid", "string", False)},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "string", False)},
    "BoundObjectReference": {1: ("kind", "string", False), 2: ("apiVersion", "string", False),
                             3: ("name", "string", False), 4: ("uid", "string", False)},
    "TokenRequestSpec": {1: ("audiences", "string", True), 3: ("boundObjectRef", "BoundObjectReference", False),
                         4: ("expirationSeconds", "int", False)},
}
SPEC = {
    "SelfSubjectAccessReview": "SelfSubjectAccessReviewSpec",
    "SubjectAccessReview": "SubjectAccessReviewSpec",
    "LocalSubjectAccessReview": "SubjectAccessReviewSpec",
    "SelfSubjectRulesReview": "SelfSubjectRulesReviewSpec",
    "SelfSubjectReview": "",
    "TokenRequest": "TokenRequestSpec",
}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            out.append((number, value))
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            out.append((number, data[at:at + size]))
            at += size
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _message(data: bytes, name: str) -> dict[str, Any]:
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, raw in _fields(data):
        if number not in schema:
            continue
        key, kind, repeated = schema[number]
        value: Any
        if kind == "int":
            if not isinstance(raw, int):
                raise ValueError(f"{name}.{key}: expected a varint")
            value = raw
        else:
            if not isinstance(raw, bytes):
                raise ValueError(f"{name}.{key}: expected bytes")
            value = raw if kind == "bytes" else raw.decode() if kind == "string" else _message(raw, kind)
        if repeated:
            out.setdefault(key, []).append(value)
        else:
            out[key] = value
    return out


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded access review or TokenRequest (400 otherwise)."""
    if not body.startswith(MAGIC):
        raise errors.BadRequest("a protobuf body must start with the k8s magic number")
    try:
        unknown = _message(body[len(MAGIC):], "Unknown")
        meta = unknown.get("typeMeta") or {}
        kind = meta.get("kind", "")
        if kind not in SPEC:
            raise errors.UnsupportedMediaType(
                f"the simulated cluster speaks JSON only, not protobuf, for {kind or 'this kind'} (kubectl's "
                "imperative `create <kind>` generators send protobuf: use `kubectl apply -f` or `kubectl create -f`)")
        out: dict[str, Any] = {"kind": kind, "apiVersion": meta.get("apiVersion", "")}
        spec = SPEC[kind]
        for number, raw in _fields(unknown.get("raw") or b""):
            if number == 2 and spec and isinstance(raw, bytes):
                out["spec"] = _message(raw, spec)
        return out
    except ValueError as exc:
        raise errors.BadRequest(f"the protobuf body could not be decoded: {exc}") from None
