"""The capacity side's settings: node provisioner timings, prices, and refused launches.

A ``kind: Settings`` document's ``capacity`` section (every field optional; times in
simulated seconds; sources in docs/sim.md):

    capacity:
      batchIdleDurationSeconds: 1        # Karpenter BATCH_IDLE_DURATION
      batchMaxDurationSeconds: 10        # Karpenter BATCH_MAX_DURATION
      launchToReadySeconds: {min: 30, max: 40}   # uniform; Karpenter maintainers' 30-40 s
      unavailableOfferingsTTLSeconds: 180 # Karpenter's ICE cache (UnavailableOfferingsTTL)
      disruptionPollSeconds: 10          # Karpenter's disruption controller pollingPeriod
      interruptionHandling: false        # Karpenter's --interruption-queue set: it drains noticed nodes
      prices: {m5.xlarge: {onDemand: 0.192, spot: 0.07}}
      insufficientCapacity:              # launches the cloud refuses (ICE) while the window lasts
      - {capacityType: spot, instanceTypes: [m5.xlarge], zones: [us-east-1a], fromSeconds: 0, untilSeconds: 600}
      clusterAutoscaler: {...}           # node groups: spotguard_sim.nodegroups

Times in ``insufficientCapacity`` count from the cluster's start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from spotguard.logs import UserError

from spotguard_sim import catalogue, nodegroups

# kubernetes-sigs/karpenter pkg/operator/options/options.go
BATCH_IDLE_DURATION = 1.0
BATCH_MAX_DURATION = 10.0
# "We typically see new nodes come up in about 30-40s in a ready state"
# (aws/karpenter-provider-aws#6165, a Karpenter maintainer)
LAUNCH_TO_READY = (30.0, 40.0)
# aws/karpenter-provider-aws pkg/cache/cache.go UnavailableOfferingsTTL
UNAVAILABLE_OFFERINGS_TTL = 180.0
# kubernetes-sigs/karpenter pkg/controllers/disruption/controller.go pollingPeriod
DISRUPTION_POLL = 10.0


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Launches of these offerings fail with InsufficientInstanceCapacity during [start, end)."""

    capacity_type: str
    instance_types: tuple[str, ...] = ()  # empty: every type
    zones: tuple[str, ...] = ()  # empty: every zone
    start: float = 0.0
    end: float = float("inf")

    def refuses(self, instance_type: str, capacity_type: str, zone: str, elapsed: float) -> bool:
        return (capacity_type == self.capacity_type
                and (not self.instance_types or instance_type in self.instance_types)
                and (not self.zones or zone in self.zones)
                and self.start <= elapsed < self.end)


@dataclasses.dataclass(frozen=True)
class Capacity:
    batch_idle: float = BATCH_IDLE_DURATION
    batch_max: float = BATCH_MAX_DURATION
    launch_to_ready: tuple[float, float] = LAUNCH_TO_READY
    unavailable_ttl: float = UNAVAILABLE_OFFERINGS_TTL
    disruption_poll: float = DISRUPTION_POLL
    interruption_handling: bool = False
    prices: catalogue.Prices = dataclasses.field(default_factory=catalogue.Prices)
    refusals: tuple[Refusal, ...] = ()
    cluster_autoscaler: nodegroups.ClusterAutoscaler = dataclasses.field(
        default_factory=nodegroups.ClusterAutoscaler)


def _seconds(raw: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UserError(f"{where}: capacity.{key} must be a non-negative number, got {value!r}")
    return float(value)


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: {key} must be a list of strings")
    return tuple(value)


FIELDS = ("batchIdleDurationSeconds", "batchMaxDurationSeconds", "launchToReadySeconds",
          "unavailableOfferingsTTLSeconds", "disruptionPollSeconds", "interruptionHandling", "prices",
          "insufficientCapacity", "clusterAutoscaler")


def from_doc(raw: Any, where: str) -> Capacity:
    if raw is None:
        return Capacity()
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: capacity must be a mapping")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise UserError(f"{where}: unknown capacity field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    ready = raw.get("launchToReadySeconds") or {}
    if not isinstance(ready, Mapping):
        raise UserError(f"{where}: capacity.launchToReadySeconds must be a mapping {{min, max}}")
    low = _seconds(ready, "min", LAUNCH_TO_READY[0], where)
    high = _seconds(ready, "max", max(low, LAUNCH_TO_READY[1]) if "min" in ready else LAUNCH_TO_READY[1], where)
    if high < low:
        raise UserError(f"{where}: capacity.launchToReadySeconds max is below min")
    handling = raw.get("interruptionHandling", False)
    if not isinstance(handling, bool):
        raise UserError(f"{where}: capacity.interruptionHandling must be true or false")
    prices = raw.get("prices") or {}
    if not isinstance(prices, Mapping) or not all(
            isinstance(p, Mapping) and set(p) <= {"onDemand", "spot", "reserved"}
            and all(not isinstance(v, bool) and isinstance(v, (int, float)) and v >= 0 for v in p.values())
            for p in prices.values()):
        raise UserError(f"{where}: capacity.prices maps an instance type to {{onDemand, spot}} USD per hour")
    refusals = []
    for i, item in enumerate(raw.get("insufficientCapacity") or []):
        here = f"{where}: capacity.insufficientCapacity[{i}]"
        if not isinstance(item, Mapping) or item.get("capacityType") not in ("spot", "on-demand"):
            raise UserError(f"{here} needs capacityType spot or on-demand")
        refusals.append(Refusal(
            capacity_type=str(item["capacityType"]), instance_types=_strings(item, "instanceTypes", here),
            zones=_strings(item, "zones", here), start=_seconds(item, "fromSeconds", 0.0, here),
            end=_seconds(item, "untilSeconds", float("inf"), here)))
    return Capacity(
        batch_idle=_seconds(raw, "batchIdleDurationSeconds", BATCH_IDLE_DURATION, where),
        batch_max=_seconds(raw, "batchMaxDurationSeconds", BATCH_MAX_DURATION, where),
        launch_to_ready=(low, high),
        unavailable_ttl=_seconds(raw, "unavailableOfferingsTTLSeconds", UNAVAILABLE_OFFERINGS_TTL, where),
        disruption_poll=_seconds(raw, "disruptionPollSeconds", DISRUPTION_POLL, where),
        interruption_handling=handling,
        prices=catalogue.Prices({str(k): dict(v) for k, v in prices.items()}),
        refusals=tuple(refusals),
        cluster_autoscaler=nodegroups.from_doc(raw.get("clusterAutoscaler"), where),
    )
