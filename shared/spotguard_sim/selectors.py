"""Label and field selectors, in the Kubernetes string syntax and as LabelSelector dicts.

https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors
https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spotguard_sim import errors

Labels = Mapping[str, str]

_KEY = re.compile(r"^([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Labels) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        return False


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Labels | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.nothing

    def equality(self) -> dict[str, str]:
        """The key=value requirements (for index lookups)."""
        return {r.key: r.values[0] for r in self.requirements if r.op == "="}


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


_SET = re.compile(r"^(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def _check_key(key: str, text: str) -> None:
    if not _KEY.match(key):
        raise errors.BadRequest(f"unable to parse requirement: invalid label key {key!r} in {text!r}")


def parse_labels(text: str | None) -> LabelSelector:
    """Parse ``app=web,tier in (a,b),!x``; raises BadRequest on bad syntax."""
    if not text or not text.strip():
        return LabelSelector()
    reqs: list[Requirement] = []
    for term in _split_terms(text):
        m = _SET.match(term)
        if m:
            key = m.group("key")
            _check_key(key, text)
            values = tuple(v.strip() for v in m.group("values").split(",") if v.strip())
            reqs.append(Requirement(key, m.group("op"), values))
            continue
        if term.startswith("!"):
            key = term[1:].strip()
            _check_key(key, text)
            reqs.append(Requirement(key, "!"))
            continue
        for op, name in (("!=", "!="), ("==", "="), ("=", "=")):
            if op in term:
                key, _, value = term.partition(op)
                key, value = key.strip(), value.strip()
                _check_key(key, text)
                reqs.append(Requirement(key, name, (value,)))
                break
        else:
            _check_key(term, text)
            reqs.append(Requirement(term, "exists"))
    return LabelSelector(tuple(reqs))


def from_dict(selector: Mapping[str, Any] | None, *, none_matches_all: bool = False) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels / matchExpressions).

    An empty selector ``{}`` matches everything; ``None`` matches nothing unless
    ``none_matches_all`` (PodDisruptionBudget: nil selects nothing; webhook
    namespaceSelector: absent selects everything).
    """
    if selector is None:
        return LabelSelector() if none_matches_all else LabelSelector(nothing=True)
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = str(expr.get("operator", ""))
        key = str(expr.get("key", ""))
        values = tuple(str(v) for v in expr.get("values") or [])
        mapped = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(op)
        if mapped is None:
            raise errors.BadRequest(f"{op!r} is not a valid label selector operator")
        reqs.append(Requirement(key, mapped, values))
    return LabelSelector(tuple(reqs))


def matches(selector: Mapping[str, Any] | None, labels: Labels | None) -> bool:
    """Does the LabelSelector dict select these labels (None selects nothing)?"""
    return from_dict(selector).matches(labels)


# --- field selectors ----------------------------------------------------------

_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
SUPPORTED_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        *_COMMON_FIELDS,
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "nodes": (*_COMMON_FIELDS, "spec.unschedulable"),
    "namespaces": (*_COMMON_FIELDS, "status.phase"),
    "events": (
        *_COMMON_FIELDS,
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "replicasets": (*_COMMON_FIELDS, "status.replicas"),
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.field)
        return (actual != self.value) if self.negate else (actual == self.value)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def equals(self, name: str) -> str | None:
        for r in self.requirements:
            if r.field == name and not r.negate:
                return r.value
        return None


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a field for selector matching ("" when absent)."""
    if path == "source":
        source = obj.get("source") or {}
        return str(source.get("component", "") if isinstance(source, Mapping) else "")
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        if path in ("spec.unschedulable", "spec.hostNetwork"):
            return "false"
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_fields(text: str | None, resource: str) -> FieldSelector:
    """Parse ``spec.nodeName=n1,status.phase!=Failed``; 400 for unsupported fields."""
    if not text or not text.strip():
        return FieldSelector()
    allowed = SUPPORTED_FIELDS.get(resource, _COMMON_FIELDS)
    reqs: list[FieldRequirement] = []
    for term in _split_terms(text):
        for op, negate in (("!=", True), ("==", False), ("=", False)):
            if op in term:
                key, _, value = term.partition(op)
                key = key.strip()
                if key not in allowed:
                    raise errors.BadRequest(
                        f'field label not supported: {key}'
                    )
                reqs.append(FieldRequirement(key, value.strip(), negate))
                break
        else:
            raise errors.BadRequest(
                f"invalid selector: '{text}'; can't understand '{term}'"
            )
    return FieldSelector(tuple(reqs))


def object_filter(
    label_selector: str | None, field_selector: str | None, resource: str
) -> Callable[[Mapping[str, Any]], bool] | None:
    """A predicate for objects, or None when both selectors are empty."""
    labels = parse_labels(label_selector)
    fields = parse_fields(field_selector, resource)
    if labels.empty and not fields.requirements:
        return None

    def check(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return labels.matches(meta.get("labels")) and fields.matches(obj)

    return check
