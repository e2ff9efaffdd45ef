"""Node capacity classification: spot, on-demand or unknown, from label schemes."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class Capacity(enum.StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LabelScheme:
    """One node label that tells the capacity type.

    ``spot`` and ``on_demand`` are the label values that mean each type. A
    scheme with no on-demand values (GKE's ``cloud.google.com/gke-spot``) marks
    only spot nodes; an absent label says nothing under it.
    """

    key: str
    spot: frozenset[str]
    on_demand: frozenset[str] = frozenset()

    def classify(self, labels: Mapping[str, str]) -> Capacity:
        value = labels.get(self.key)
        if value is None:
            return Capacity.UNKNOWN
        if value in self.spot:
            return Capacity.SPOT
        if value in self.on_demand:
            return Capacity.ON_DEMAND
        return Capacity.UNKNOWN


def scheme(key: str, spot: Iterable[str], on_demand: Iterable[str] = ()) -> LabelScheme:
    return LabelScheme(key=key, spot=frozenset(spot), on_demand=frozenset(on_demand))


DEFAULT_SCHEMES: tuple[LabelScheme, ...] = (
    scheme("node.kubernetes.io/capacity", ["spot"], ["on-demand"]),
    # ``reserved`` (capacity reservations) is not interruptible: it counts as on-demand.
    scheme("karpenter.sh/capacity-type", ["spot"], ["on-demand", "reserved"]),
    scheme("eks.amazonaws.com/capacityType", ["SPOT"], ["ON_DEMAND"]),
    scheme("cloud.google.com/gke-spot", ["true"]),
    # GKE preemptible VMs (the older spot kind, reclaimed at least every 24 h): spot too.
    scheme("cloud.google.com/gke-preemptible", ["true"]),
    scheme("kubernetes.azure.com/scalesetpriority", ["spot"], ["regular"]),
)


def classify(
    labels: Mapping[str, str], schemes: Iterable[LabelScheme] = DEFAULT_SCHEMES
) -> Capacity:
    """The capacity of a node with these labels.

    Spot under any scheme wins (an interruptible node is spot whatever another
    label says); otherwise on-demand under any scheme; otherwise unknown. This is
    exactly what the admission patch's on-demand requirement ("not spot under any
    scheme") and spot preferences select.
    """
    found = Capacity.UNKNOWN
    for s in schemes:
        verdict = s.classify(labels)
        if verdict is Capacity.SPOT:
            return Capacity.SPOT
        if verdict is Capacity.ON_DEMAND:
            found = Capacity.ON_DEMAND
    return found


def spot_values(schemes: Iterable[LabelScheme]) -> dict[str, frozenset[str]]:
    """Label key -> the values that mean spot, merged over schemes that share a key."""
    out: dict[str, frozenset[str]] = {}
    for s in schemes:
        out[s.key] = out.get(s.key, frozenset()) | s.spot
    return out


def on_demand_values(schemes: Iterable[LabelScheme]) -> dict[str, frozenset[str]]:
    """Label key -> the values that mean on-demand (keys with none are left out)."""
    out: dict[str, frozenset[str]] = {}
    for s in schemes:
        if s.on_demand:
            out[s.key] = out.get(s.key, frozenset()) | s.on_demand
    return out


def parse_schemes(text: str) -> tuple[LabelScheme, ...]:
    """Parse ``key=spotvalue|spotvalue2:ondemandvalue|...`` entries separated by commas.

    Example: ``karpenter.sh/capacity-type=spot:on-demand,cloud.google.com/gke-spot=true:``.
    Raises ValueError with a message naming the bad entry.
    """
    out: list[LabelScheme] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, values = entry.partition("=")
        spot_part, sep2, od_part = values.partition(":")
        spot = [v for v in spot_part.split("|") if v]
        if not sep or not sep2 or not key.strip() or not spot:
            raise ValueError(
                f"label scheme {entry!r}: expected key=spot[|spot...]:on-demand[|on-demand...]"
            )
        out.append(scheme(key.strip(), spot, [v for v in od_part.split("|") if v]))
    if not out:
        raise ValueError("no label schemes given")
    return tuple(out)
