"""What the fuzzers send: random JSON, mutated real payloads, odd bodies, odd headers.

Every strategy here is transport-neutral; :mod:`tests.fuzz.entrypoints` turns
them into HTTP requests or Lambda events. The real payloads come from
``tests/events/`` (EventBridge, SQS, CloudEvents samples as AWS and Knative send
them) and ``tests/admission/payloads/`` (AdmissionReviews captured from
kube-apiserver, a Lambda Function URL event).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "tests" / "events"
REVIEWS = ROOT / "tests" / "admission" / "payloads"

Path_ = tuple[str | int, ...]


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def admission_reviews() -> list[dict[str, Any]]:
    """Every captured AdmissionReview (not the Lambda event, not the owners list)."""
    out = []
    for path in sorted(REVIEWS.glob("*.json")):
        doc = _load(path)
        if isinstance(doc, dict) and doc.get("kind") == "AdmissionReview":
            out.append(doc)
    return out


def function_url_event() -> dict[str, Any]:
    event: dict[str, Any] = _load(REVIEWS / "lambda-function-url-event.json")
    return event


def aws_events() -> list[Any]:
    """The EventBridge events and SQS batches of tests/events (the CloudEvent samples aside)."""
    return [_load(p) for p in sorted(EVENTS.glob("*.json")) if not p.name.startswith("cloudevent-")]


def cloudevent_samples() -> list[dict[str, Any]]:
    """The CloudEvent HTTP requests of tests/events: ``{"headers": {...}, "body": "..."}``."""
    return [_load(p) for p in sorted(EVENTS.glob("cloudevent-*.json"))]


# -- JSON ---------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


def _paths(doc: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*prefix, index))


def _set(doc: Any, path: Path_, value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


# Replacements that are wrong in ways a parser must survive (a type changed, a huge
# or empty value, a container where a scalar belongs).
odd_values = st.one_of(
    json_values,
    st.sampled_from(["", "0", "-1", "null", "true", "{}", "[]", "\x00", "é" * 50, "a" * 5000, "😀"]),
    st.sampled_from([0, -1, 2**63, -(2**63), 1e308, -0.0, True, False, None, [], {}, [[]], {"": {}}]),
).map(copy.deepcopy)  # never share one list or dict between places (a list inside itself)


@st.composite
def mutated(draw: st.DrawFn, docs: Sequence[Any], max_mutations: int = 3) -> Any:
    """One of ``docs`` with one to ``max_mutations`` fields replaced, deleted, emptied or added."""
    doc = copy.deepcopy(draw(st.sampled_from(list(docs))))
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if operation == "delete" and path:
            doc = _set(doc, path, None, delete=True)
        elif operation == "add":
            target = doc
            for key in path:
                target = target[key]
            if isinstance(target, dict):
                target[draw(st.text(max_size=12))] = draw(odd_values)
            elif isinstance(target, list):
                target.append(draw(odd_values))
            else:
                doc = _set(doc, path, draw(odd_values))
        else:
            doc = _set(doc, path, draw(odd_values))
    return doc


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


# -- bodies -------------------------------------------------------------------------------


def deep(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@dataclass(frozen=True)
class Extremes:
    """Bodies too big, too deep or not UTF-8, built once (hypothesis samples them)."""

    limit: int  # the server's body limit in bytes
    bodies: tuple[bytes, ...] = field(init=False)

    def __post_init__(self) -> None:
        bodies = (
            b"",
            b"[" * 100_000,
            b"[" * 5_000 + b"]" * 5_000,
            deep(3_000),
            deep(100_000),
            b" " * (self.limit + 1),
            b'{"a": "' + b"x" * (self.limit - 20) + b'"}',  # just under the limit
            b"\xff\xfe" + '{"kind": "AdmissionReview"}'.encode("utf-16-le"),
            '{"kind": "é"}'.encode("latin-1"),
            b'{"a": "\xc3\x28"}',  # an invalid UTF-8 sequence inside a string
            b'{"a": "\\ud800"}',  # a lone surrogate escape
            b"\x00" * 64,
            b'{"a": 1e999999}',
            b'{"a": ' + b"9" * 5000 + b"}",  # Python refuses to parse ints this long by default
            b'{"a": 1, "a": 2}',
        )
        object.__setattr__(self, "bodies", bodies)


def not_utf8(body: bytes) -> bytes:
    """Valid JSON made invalid UTF-8: a byte 0xff inserted after the first quote."""
    index = body.find(b'"')
    return body[: index + 1] + b"\xff" + body[index + 1 :] if index >= 0 else b"\xff" + body


def bodies(documents: st.SearchStrategy[Any], extremes: Extremes) -> st.SearchStrategy[bytes]:
    """Bodies built from ``documents`` (JSON values), raw bytes and the extremes."""
    return st.one_of(
        documents.map(dumps),
        documents.map(dumps),
        documents.map(dumps),
        json_values.map(dumps),
        documents.map(dumps).map(not_utf8),
        st.binary(max_size=300),
        st.sampled_from(extremes.bodies),
    )


header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip)
content_types = st.one_of(
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=latin-1",
            "application/cloudevents+json",
            "application/cloudevents-batch+json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/octet-stream",
            "",
        ]
    ),
    header_text,
)
