"""Kubernetes taints and tolerations as the policy sees them, and matching.

Semantics follow https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Taint:
        return cls(str(raw.get("key", "")), str(raw.get("value") or ""), str(raw.get("effect", "")))

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(
            key=str(raw.get("key") or ""),
            operator=str(raw.get("operator") or "Equal"),
            value=str(raw.get("value") or ""),
            effect=str(raw.get("effect") or ""),
        )

    def to_json(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value and self.operator != "Exists":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            # An empty key with operator Exists matches every taint.
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


def tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


def untolerated(
    taints: Iterable[Taint], tolerations: Iterable[Toleration], effects: Iterable[str]
) -> list[Taint]:
    """Taints with one of ``effects`` that no toleration covers."""
    wanted = set(effects)
    tols = list(tolerations)
    return [t for t in taints if t.effect in wanted and not tolerated(t, tols)]


def parse_toleration(text: str) -> Toleration:
    """Parse ``key[=value][:effect]`` (``key:effect`` means operator Exists)."""
    body, _, effect = text.strip().partition(":")
    key, eq, value = body.partition("=")
    if not key:
        raise ValueError(f"toleration {text!r}: expected key[=value][:effect]")
    if effect and effect not in {"NoSchedule", "PreferNoSchedule", "NoExecute"}:
        raise ValueError(f"toleration {text!r}: unknown effect {effect!r}")
    if eq:
        return Toleration(key=key, operator="Equal", value=value, effect=effect)
    return Toleration(key=key, operator="Exists", effect=effect)
