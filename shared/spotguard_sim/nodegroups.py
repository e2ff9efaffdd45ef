"""Cluster Autoscaler's node groups (pure): their settings, their template nodes, how many
new nodes a batch of pods needs in each, and the expander's pick.

kubernetes/autoscaler ``cluster-autoscaler/FAQ.md`` (read at its August 2026 head):
scan every 10 s (``--scan-interval``); a node group's template node is checked for
each unschedulable pod; the expander picks the group (``--expander`` default
``least-waste``: "the least idle CPU (if tied, unused memory) after scale-up";
``price``: the cheapest, which upstream implements for GCE, GKE and Equinix Metal
only; ``random``); a node is unneeded when the sum of its pods' cpu and memory
requests (DaemonSet pods included) is below 50 % of its allocatable
(``--scale-down-utilization-threshold``) and its pods can move, and is removed after
10 minutes unneeded (``--scale-down-unneeded-time``), not within 10 minutes of a
scale-up (``--scale-down-delay-after-add``); a group whose launch failed backs off
5 minutes (``--initial-node-group-backoff-duration``).

Expendable pods (``--expendable-pods-priority-cutoff``, default -10; FAQ.md "How does Cluster
Autoscaler work with Pod Priority and Preemption?"): a pod whose ``spec.priority`` is set and
*below* the cutoff. Upstream (read at cluster-autoscaler-1.36.1) applies it in
``core/utils/expendable.go`` (``IsExpendablePod``: ``pod.Spec.Priority != nil &&
int(*pod.Spec.Priority) < cutoff``), filters such pods out of the unschedulable ones before a
scale-up (``core/podlistprocessor/filter_out_expendable.go``) and out of the cluster snapshot
that every simulation reads (``core/static_autoscaler.go``: ``FilterOutExpendablePods`` on the
scheduled and nominated pods before ``SetClusterState``; ``core/scaledown/actuation/
actuator.go`` ``createSnapshot`` likewise for the drain): they cause no scale-up, take no room
in the filter-out-schedulable step (a pending pod that fits in their room scales nothing up:
the scheduler preempts them), count for no node's utilization, never keep a node, and are not
evicted by a scale-down's drain (they go with the node). Between cluster-autoscaler 1.30.0 and
1.33.0 (commit 6632bab, reverted by 6f0f000 and in 1.30.5, 1.31.3, 1.32.2, 1.33.1 and 1.34.0 on)
a pod with ``preemptionPolicy: Never`` was never expendable; this follows the current rule.
A pending pod nominated to an existing node (``status.nominatedNodeName``: a preemptor waiting
for its victims) is no scale-up candidate either (``utils/kubernetes/listers.go``
``ArrangePodsBySchedulability``: its own list, put in the snapshot on that node).

A scenario declares them in its Settings (``capacity.clusterAutoscaler``):

    clusterAutoscaler:
      scanIntervalSeconds: 10
      expander: least-waste            # least-waste | price | random
      scaleDownUnneededTimeSeconds: 600
      scaleDownUtilizationThreshold: 0.5
      scaleDownDelayAfterAddSeconds: 600
      nodeGroupBackoffSeconds: 300
      expendablePodsPriorityCutoff: -10  # pods below it: no scale-up, never keep a node
      nodeGroups:
      - {name: od, instanceType: m5.xlarge, capacityType: on-demand, minSize: 1, maxSize: 10,
         zones: [us-east-1a, us-east-1b], labels: {...}, taints: [...]}

Nodes carry the labels of an EKS managed node group (``eks.amazonaws.com/nodegroup``,
``eks.amazonaws.com/capacityType`` ``ON_DEMAND``/``SPOT``).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from spotguard.logs import UserError

from spotguard_sim import catalogue, nodepools, scheduler

PodT = TypeVar("PodT", bound=Mapping[str, Any])

NODEGROUP = "eks.amazonaws.com/nodegroup"
CAPACITY_TYPE = "eks.amazonaws.com/capacityType"
EKS_CAPACITY = {"spot": "SPOT", "on-demand": "ON_DEMAND"}
EXPANDERS = ("least-waste", "price", "random")  # --expander (least-waste by default)
# cluster-autoscaler flags and their defaults (FAQ.md, "What are the parameters to CA?"):
# --scan-interval, --scale-down-unneeded-time, --scale-down-utilization-threshold,
# --scale-down-delay-after-add, --initial-node-group-backoff-duration
SCAN_INTERVAL, SCALE_DOWN_UNNEEDED_TIME, SCALE_DOWN_UTILIZATION_THRESHOLD = 10.0, 600.0, 0.5
SCALE_DOWN_DELAY_AFTER_ADD, NODE_GROUP_BACKOFF = 600.0, 300.0
# --scale-down-delay-after-failure; MaxPodEvictionTime and EvictionRetryTime
# (cluster-autoscaler/core/scaledown/actuation: a pod not evicted in 2 minutes fails the
# node's scale-down, its ToBeDeletedByClusterAutoscaler taint is removed)
SCALE_DOWN_DELAY_AFTER_FAILURE, MAX_POD_EVICTION_TIME, EVICTION_RETRY_TIME = 180.0, 120.0, 10.0
# --expendable-pods-priority-cutoff (config/flags/flags.go)
EXPENDABLE_PODS_PRIORITY_CUTOFF = -10


@dataclasses.dataclass(frozen=True)
class NodeGroup:
    name: str
    instance_type: catalogue.InstanceType
    capacity_type: str
    min_size: int = 0
    max_size: int = 10
    zones: tuple[str, ...] = catalogue.ZONES
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[tuple[str, str], ...], ...] = ()

    def node_labels(self, name: str, zone: str) -> dict[str, str]:
        t = self.instance_type
        return {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            nodepools.INSTANCE_TYPE: t.name, nodepools.ZONE: zone, nodepools.REGION: catalogue.REGION,
            NODEGROUP: self.name, CAPACITY_TYPE: EKS_CAPACITY[self.capacity_type], **dict(self.labels),
        }

    def node_taints(self) -> list[dict[str, str]]:
        return [dict(t) for t in self.taints]

    def template(self) -> scheduler.NodeInfo:
        node = {"metadata": {"name": "", "labels": self.node_labels("", self.zones[0])},
                "spec": {"taints": self.node_taints()}, "status": {"allocatable": self.instance_type.allocatable()}}
        return scheduler.NodeInfo.from_node(node)


@dataclasses.dataclass(frozen=True)
class ScaleDown:
    """When a node goes: unneeded this long, below this utilization, not this soon after a scale-up."""

    unneeded_time: float = SCALE_DOWN_UNNEEDED_TIME
    utilization_threshold: float = SCALE_DOWN_UTILIZATION_THRESHOLD
    delay_after_add: float = SCALE_DOWN_DELAY_AFTER_ADD
    delay_after_failure: float = SCALE_DOWN_DELAY_AFTER_FAILURE
    max_pod_eviction_time: float = MAX_POD_EVICTION_TIME


@dataclasses.dataclass(frozen=True)
class ClusterAutoscaler:
    """The autoscaler's flags (``scanIntervalSeconds`` is ``--scan-interval``...) and its node groups;
    ``backoff``: how long a group whose launch failed waits."""

    node_groups: tuple[NodeGroup, ...] = ()
    scan_interval: float = SCAN_INTERVAL
    expander: str = "least-waste"
    scale_down: ScaleDown = dataclasses.field(default_factory=ScaleDown)
    backoff: float = NODE_GROUP_BACKOFF
    expendable_pods_priority_cutoff: int = EXPENDABLE_PODS_PRIORITY_CUTOFF


def expendable(pod: Mapping[str, Any], cutoff: int) -> bool:
    """``IsExpendablePod``: a priority set and below the cutoff (a pod without one is not)."""
    priority = (pod.get("spec") or {}).get("priority")
    return isinstance(priority, int) and not isinstance(priority, bool) and priority < cutoff


@dataclasses.dataclass(frozen=True)
class Option:
    """Scaling ``group`` up by ``nodes`` places ``pods`` (indexes into the batch)."""

    group: NodeGroup
    nodes: int
    pods: tuple[int, ...]
    requested: Mapping[str, int]

    @property
    def waste(self) -> tuple[float, float]:
        alloc = self.group.template().allocatable
        cpu = alloc.get("cpu", 1) * self.nodes
        memory = alloc.get("memory", 1) * self.nodes
        return ((cpu - self.requested.get("cpu", 0)) / cpu, (memory - self.requested.get("memory", 0)) / memory)

    @property
    def price(self) -> float:
        return self.nodes * self.group.instance_type.price(self.group.capacity_type)


def option(group: NodeGroup, pods: list[scheduler.PodInfo], room: int,
           daemons: Iterable[scheduler.PodInfo] = ()) -> Option | None:
    """Binpack the pods the group's template admits onto at most ``room`` new nodes (first fit)."""
    if room <= 0:
        return None
    template = group.template()
    overhead, overhead_pods = nodepools.daemon_overhead(template, daemons)
    bins: list[tuple[Counter[str], int]] = []
    placed: list[int] = []
    total: Counter[str] = Counter()
    for i, pod in enumerate(pods):
        if not nodepools.admits(pod, template):
            continue
        for b, (used, count) in enumerate(bins):
            want = used + Counter(pod.requests)
            if nodepools.fits(want, count + 1, template):
                bins[b] = (want, count + 1)
                break
        else:
            first = overhead + Counter(pod.requests)
            if len(bins) >= room or not nodepools.fits(first, overhead_pods + 1, template):
                continue
            bins.append((first, overhead_pods + 1))
        placed.append(i)
        total.update(pod.requests)
    if not bins:
        return None
    total.update({k: v * len(bins) for k, v in overhead.items()})
    return Option(group, len(bins), tuple(placed), dict(total))


def expand(options: list[Option], expander: str, rng: random.Random) -> Option | None:
    if not options:
        return None
    if expander == "price":
        return min(options, key=lambda o: (o.price, o.group.name))
    if expander == "random":
        return rng.choice(sorted(options, key=lambda o: o.group.name))
    return min(options, key=lambda o: (o.waste, o.group.name))


def utilization(node: scheduler.NodeInfo) -> float:
    """max(cpu requested / allocatable, memory requested / allocatable)."""
    shares = [node.usage.requested.get(k, 0) / node.allocatable[k] for k in ("cpu", "memory")
              if node.allocatable.get(k)]
    return max(shares, default=0.0)


def _number(raw: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UserError(f"{where}: {key} must be a non-negative number, got {value!r}")
    return float(value)


def from_doc(raw: Any, where: str) -> ClusterAutoscaler:
    if raw is None:
        return ClusterAutoscaler()
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: clusterAutoscaler must be a mapping")
    expander = raw.get("expander", "least-waste")
    if expander not in EXPANDERS:
        raise UserError(f"{where}: clusterAutoscaler.expander must be one of {', '.join(EXPANDERS)}")
    groups = []
    for i, g in enumerate(raw.get("nodeGroups") or []):
        here = f"{where}: clusterAutoscaler.nodeGroups[{i}]"
        if not isinstance(g, Mapping) or not g.get("name"):
            raise UserError(f"{here} needs a name")
        t = catalogue.get(str(g.get("instanceType", "m5.xlarge")))
        if t is None:
            raise UserError(f"{here}: instanceType {g.get('instanceType')!r} is not in the catalogue "
                            f"({', '.join(catalogue.TYPES)})")
        capacity_type = str(g.get("capacityType", "on-demand"))
        if capacity_type not in EKS_CAPACITY:
            raise UserError(f"{here}: capacityType must be spot or on-demand")
        low, high = int(_number(g, "minSize", 0, here)), int(_number(g, "maxSize", 10, here))
        if high < low:
            raise UserError(f"{here}: maxSize is below minSize")
        groups.append(NodeGroup(
            name=str(g["name"]), instance_type=t, capacity_type=capacity_type, min_size=low, max_size=high,
            zones=tuple(str(z) for z in g.get("zones") or catalogue.ZONES),
            labels=tuple((str(k), str(v)) for k, v in (g.get("labels") or {}).items()),
            taints=tuple(tuple((str(k), str(v)) for k, v in t_.items()) for t_ in g.get("taints") or [])))
    return ClusterAutoscaler(
        node_groups=tuple(groups), expander=str(expander),
        scan_interval=_number(raw, "scanIntervalSeconds", SCAN_INTERVAL, where),
        scale_down=ScaleDown(
            unneeded_time=_number(raw, "scaleDownUnneededTimeSeconds", SCALE_DOWN_UNNEEDED_TIME, where),
            utilization_threshold=_number(raw, "scaleDownUtilizationThreshold", SCALE_DOWN_UTILIZATION_THRESHOLD,
                                          where),
            delay_after_add=_number(raw, "scaleDownDelayAfterAddSeconds", SCALE_DOWN_DELAY_AFTER_ADD, where),
            delay_after_failure=_number(raw, "scaleDownDelayAfterFailureSeconds", SCALE_DOWN_DELAY_AFTER_FAILURE,
                                        where),
            max_pod_eviction_time=_number(raw, "maxPodEvictionTimeSeconds", MAX_POD_EVICTION_TIME, where)),
        backoff=_number(raw, "nodeGroupBackoffSeconds", NODE_GROUP_BACKOFF, where),
        expendable_pods_priority_cutoff=_cutoff(raw, where),
    )


def _cutoff(raw: Mapping[str, Any], where: str) -> int:
    value = raw.get("expendablePodsPriorityCutoff", EXPENDABLE_PODS_PRIORITY_CUTOFF)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{where}: expendablePodsPriorityCutoff must be an integer, got {value!r}")
    return value


def not_schedulable_now(
    pending: Iterable[PodT],
    nodes: Iterable[Mapping[str, Any]],
    pods_on: Callable[[str], Iterable[Mapping[str, Any]]],
) -> list[PodT]:
    """The pending pods that fit no node already in the cluster: the ones a scale-up is for.

    Upstream's filter-out-schedulable step (cluster-autoscaler ``core/podlistprocessor/
    filter_out_schedulable.go``, ``FilterOutSchedulablePodListProcessor``): a pending pod
    that fits an existing node, after the pods placed before it in the same pass, triggers
    no scale-up; the scheduler binds it. Without it a node that turned Ready while its pod
    waited for the scheduler (a slow or busy scheduler) had a second node launched for the
    same pod. Here a fit is the scheduler's static filters (Ready, cordon, taints, node
    affinity and selector) and resources; inter-pod affinity and hard spread are not checked
    (upstream runs every predicate), so a pod that only those would keep off a node is
    taken as schedulable there and gets no scale-up: a harsher miss, never a kinder one.
    """
    infos = [scheduler.loaded(node, pods_on(str((node.get("metadata") or {}).get("name") or "")))
             for node in nodes if scheduler.node_ready(node)]  # pods_on: what the snapshot holds there
    return [pod for pod in pending if scheduler.first_fit(scheduler.PodInfo.from_pod(pod), infos) is None]
