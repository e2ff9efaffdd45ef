"""kube-scheduler's default filters and scores, over plain node and pod dicts.

Pure: no threads, no store. The scheduling loop lives in
``spotguard_sim.controllers.scheduling``; it feeds a :class:`Cache` from store
notifications, so per-node aggregates (requested resources, pod counts, pods
matching each topology spread selector) are kept incrementally.

Follows https://kubernetes.io/docs/concepts/scheduling-eviction/ :
- filters: NodeUnschedulable, TaintToleration (NoSchedule/NoExecute),
  NodeAffinity (nodeSelector and requiredDuringScheduling...), NodeResourcesFit
  (requests and the ``pods`` count), PodTopologySpread (DoNotSchedule), and
  NotReady nodes (upstream taints them node.kubernetes.io/not-ready);
- scores (upstream default weights): NodeResourcesFit LeastAllocated (1),
  NodeResourcesBalancedAllocation (1), ImageLocality (1), NodeAffinity
  preferred terms (2), TaintToleration PreferNoSchedule (3), PodTopologySpread
  ScheduleAnyway (2), InterPodAffinity (2), each 0..100;
- the number of feasible nodes to find follows percentageOfNodesToScore's
  adaptive default (50% - nodes/125, at least 5% and 100 nodes), searching from
  where the previous pod stopped, as kube-scheduler does.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from spotguard.policy import quantities, tolerations

from spotguard_sim import podaffinity

MAX_NODE_SCORE = 100
DEFAULT_MILLI_CPU_REQUEST = 100  # pkg/scheduler/util/pod_resources.go
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
DEFAULT_MAX_PODS = 110
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5
# pkg/scheduler/apis/config/v1/default_plugins.go (getDefaultPlugins)
WEIGHTS = {"fit": 1, "balanced": 1, "image": 1, "affinity": 2, "taint": 3, "spread": 2, "interpod": 2}
# ImageLocality's bounds (pkg/scheduler/framework/plugins/imagelocality/image_locality.go)
MB = 1024 * 1024
IMAGE_MIN_THRESHOLD = 23 * MB
IMAGE_MAX_CONTAINER_THRESHOLD = 1000 * MB
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
# PodTopologySpread's system default constraints (defaultingType: System), applied to a
# pod without constraints of its own, selecting its controller's pods
# (pkg/scheduler/framework/plugins/podtopologyspread/plugin.go systemDefaultConstraints;
# https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/#internal-default-constraints)
SYSTEM_DEFAULT_SPREAD = ((HOSTNAME, 3), (ZONE, 5))
UNSCHEDULABLE_TAINT = tolerations.Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")

Labels = Mapping[str, str]


# ---------------------------------------------------------------- selectors


def match_requirement(expr: Mapping[str, Any], labels: Labels) -> bool:
    """One node selector requirement (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    key = expr.get("key", "")
    op = expr.get("operator", "")
    values = expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def match_node_selector_term(term: Mapping[str, Any], node_name: str, labels: Labels) -> bool:
    """Expressions and fields of one term are ANDed; an empty term matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    if not all(match_requirement(e, labels) for e in exprs):
        return False
    return all(
        f.get("key") == "metadata.name" and match_requirement(f, {"metadata.name": node_name})
        for f in fields
    )


def match_node_selector_terms(terms: Iterable[Mapping[str, Any]], node_name: str, labels: Labels) -> bool:
    """Terms are ORed."""
    return any(match_node_selector_term(t, node_name, labels) for t in terms)


def match_label_selector(selector: Mapping[str, Any] | None, labels: Labels) -> bool:
    """A metav1.LabelSelector; ``None`` matches nothing, ``{}`` matches everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
        if not match_requirement(expr, labels):
            return False
    return True


def canonical(value: Any) -> str:
    """``value`` as canonical JSON (sorted keys): equal structures give equal keys."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # not JSON orjson takes (a non-string key): the standard encoder's
        return json.dumps(value, sort_keys=True)


def selector_key(selector: Mapping[str, Any] | None) -> str:
    return canonical(selector)


# ---------------------------------------------------------------- nodes and pods


def _resources(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return quantities.parse_resources(raw)


def node_ready(node: Mapping[str, Any]) -> bool:
    """The Ready condition; a node that reports no conditions counts as Ready."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return True


@dataclass
class Usage:
    """What the pods bound to a node request (kept incrementally)."""

    requested: Counter[str] = field(default_factory=Counter)
    cpu: int = 0  # requested["cpu"] and ["memory"], as attributes for the hot loop
    memory: int = 0
    nonzero_cpu: int = 0
    nonzero_memory: int = 0
    pods: int = 0


@dataclass
class NodeInfo:
    name: str
    labels: dict[str, str]
    taints: list[tolerations.Taint]
    allocatable: dict[str, int]
    unschedulable: bool
    ready: bool
    usage: Usage
    alloc_cpu: int = 0
    alloc_memory: int = 0
    alloc_pods: int = 0
    # what else a node update's requeueing looks at (nodeSchedulingPropertiesChange)
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status
    annotations: dict[str, str] = field(default_factory=dict)
    # status.images: each name the node reports, with its image's sizeBytes (ImageLocality)
    images: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_node(cls, node: Mapping[str, Any], usage: Usage | None = None) -> NodeInfo:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        alloc = _resources(status.get("allocatable") or status.get("capacity"))
        alloc.setdefault("pods", DEFAULT_MAX_PODS)
        return cls(
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            taints=[tolerations.Taint.from_json(t) for t in spec.get("taints") or []],
            allocatable=alloc,
            unschedulable=bool(spec.get("unschedulable")),
            ready=node_ready(node),
            usage=usage or Usage(),
            alloc_cpu=alloc.get("cpu", 0),
            alloc_memory=alloc.get("memory", 0),
            alloc_pods=alloc["pods"],
            conditions={str(c.get("type")): str(c.get("status")) for c in status.get("conditions") or []},
            annotations=dict(meta.get("annotations") or {}),
            images=node_images(status),
        )


def node_images(status: Mapping[str, Any]) -> dict[str, int]:
    """``status.images`` as the scheduler cache reads it (``addNodeImageStates``): every name
    of every image, with that image's ``sizeBytes`` (a name listed twice keeps its first)."""
    found: dict[str, int] = {}
    for image in status.get("images") or []:
        size = int(image.get("sizeBytes") or 0)
        for name in image.get("names") or []:
            found.setdefault(str(name), size)
    return found


def normalized_image_name(name: str) -> str:
    """ImageLocality's ``normalizedImageName``: ``:latest`` added to a name without a tag
    (no ``:`` after the last ``/``); a name with a digest is kept."""
    if name.rfind(":") <= name.rfind("/"):
        return name + ":latest"
    return name


def pod_images(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The images ImageLocality looks up for a pod, normalised: its init containers', its
    containers' and its image volumes' references, in that order, repeats kept."""
    names = [c.get("image") or "" for c in spec.get("initContainers") or []]
    names += [c.get("image") or "" for c in spec.get("containers") or []]
    names += [(v.get("image") or {}).get("reference") or "" for v in spec.get("volumes") or [] if v.get("image")]
    return tuple(normalized_image_name(str(n)) for n in names)


@dataclass
class Spread:
    max_skew: int
    topology_key: str
    hard: bool
    selector: dict[str, Any] | None
    selector_key: str
    min_domains: int
    honor_affinity: bool
    honor_taints: bool
    self_match: int


@dataclass
class PodInfo:
    """A pod compiled once for scheduling."""

    namespace: str
    name: str
    labels: dict[str, str]
    requests: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    tolerations: list[tolerations.Toleration]
    node_selector: dict[str, str]
    required_terms: list[dict[str, Any]] | None
    preferred: list[tuple[int, dict[str, Any]]]
    spreads: list[Spread]
    signature: str = ""  # what the static filters and scores depend on
    priority: int = 0
    preempts: bool = True  # preemptionPolicy PreemptLowerPriority
    host_ports: list[podaffinity.HostPort] = field(default_factory=list)
    affinity: list[podaffinity.Term] = field(default_factory=list)
    anti_affinity: list[podaffinity.Term] = field(default_factory=list)
    gated: bool = False  # spec.schedulingGates not yet removed
    # preferred pod affinity (+weight) and anti-affinity (-weight) terms, for InterPodAffinity scores
    preferred_pods: list[tuple[int, podaffinity.Term]] = field(default_factory=list)
    # ImageLocality: the images looked up (normalised) and the count of containers and init
    # containers its upper bound is scaled by
    images: tuple[str, ...] = ()
    image_slots: int = 0

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any],
                 default_spread_selector: dict[str, Any] | None = None) -> PodInfo:
        """``default_spread_selector`` (the selector of the pod's controller) turns on the
        system default topology spreading for a pod without constraints of its own."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        labels = dict(meta.get("labels") or {})
        namespace = meta.get("namespace", "default")
        requests = quantities.pod_requests(spec)
        node_aff = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
        preferred = [
            (int(p.get("weight") or 0), p.get("preference") or {})
            for p in node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ]
        spreads = []
        constraints = list(spec.get("topologySpreadConstraints") or [])
        if not constraints and default_spread_selector is not None:
            constraints = [{"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": default_spread_selector}
                           for key, skew in SYSTEM_DEFAULT_SPREAD]
        for c in constraints:
            selector = c.get("labelSelector")
            keys = [k for k in c.get("matchLabelKeys") or [] if k in labels]
            if keys:
                selector = dict(selector or {})
                selector["matchExpressions"] = list(selector.get("matchExpressions") or []) + [
                    {"key": k, "operator": "In", "values": [labels[k]]} for k in keys
                ]
            spreads.append(
                Spread(
                    max_skew=int(c.get("maxSkew") or 1),
                    topology_key=c.get("topologyKey", ""),
                    hard=c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule",
                    selector=selector,
                    selector_key=selector_key(selector),
                    min_domains=int(c.get("minDomains") or 1),
                    honor_affinity=c.get("nodeAffinityPolicy", "Honor") == "Honor",
                    honor_taints=c.get("nodeTaintsPolicy", "Ignore") == "Honor",
                    self_match=1 if match_label_selector(selector, labels) else 0,
                )
            )
        return cls(
            namespace=meta.get("namespace", "default"),
            name=meta.get("name", ""),
            labels=labels,
            requests={k: v for k, v in requests.items() if v > 0},
            nonzero_cpu=requests.get("cpu") or DEFAULT_MILLI_CPU_REQUEST,
            nonzero_memory=requests.get("memory") or DEFAULT_MEMORY_REQUEST,
            tolerations=[tolerations.Toleration.from_json(t) for t in spec.get("tolerations") or []],
            node_selector=dict(spec.get("nodeSelector") or {}),
            required_terms=(required or {}).get("nodeSelectorTerms") if required else None,
            preferred=preferred,
            spreads=spreads,
            signature=canonical(
                [
                    spec.get("nodeSelector"),
                    node_aff,
                    spec.get("tolerations"),
                    [(x.topology_key, x.honor_affinity, x.honor_taints) for x in spreads],
                ],
            ),
            priority=int(spec.get("priority") or 0),
            preempts=spec.get("preemptionPolicy", "PreemptLowerPriority") != "Never",
            host_ports=podaffinity.host_ports(spec),
            affinity=podaffinity.required_terms(spec, "podAffinity", namespace, labels),
            anti_affinity=podaffinity.required_terms(spec, "podAntiAffinity", namespace, labels),
            gated=bool(spec.get("schedulingGates")),
            preferred_pods=podaffinity.preferred_terms(spec, "podAffinity", namespace, labels)
            + [(-w, t) for w, t in podaffinity.preferred_terms(spec, "podAntiAffinity", namespace, labels)],
            images=pod_images(spec),
            image_slots=len(spec.get("initContainers") or []) + len(spec.get("containers") or []),
        )


# ---------------------------------------------------------------- filters
# Each returns None when the node passes, else the reason kube-scheduler reports.


def filter_ready(pod: PodInfo, node: NodeInfo) -> str | None:
    return None if node.ready else "node(s) were not ready"


def filter_unschedulable(pod: PodInfo, node: NodeInfo) -> str | None:
    if node.unschedulable and not tolerations.tolerated(UNSCHEDULABLE_TAINT, pod.tolerations):
        return "node(s) were unschedulable"
    return None


def filter_taints(pod: PodInfo, node: NodeInfo) -> str | None:
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerations.tolerated(
            taint, pod.tolerations
        ):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    return None


def matches_node_affinity(pod: PodInfo, node: NodeInfo) -> bool:
    """nodeSelector and required node affinity (both must hold)."""
    labels = node.labels
    for k, v in pod.node_selector.items():
        if labels.get(k) != v:
            return False
    if pod.required_terms is not None:
        return match_node_selector_terms(pod.required_terms, node.name, labels)
    return True


def filter_node_affinity(pod: PodInfo, node: NodeInfo) -> str | None:
    return None if matches_node_affinity(pod, node) else "node(s) didn't match Pod's node affinity/selector"


def filter_resources(pod: PodInfo, node: NodeInfo, held: Mapping[str, int] | None = None) -> list[str]:
    """NodeResourcesFit's reasons, with ``held`` (pods nominated to the node, ``pods`` their
    count) counted as requested."""
    held = held or {}
    reasons = []
    usage = node.usage
    if usage.pods + held.get("pods", 0) + 1 > node.allocatable.get("pods", 0):
        reasons.append("Too many pods")
    for name, want in pod.requests.items():
        if want > node.allocatable.get(name, 0) - usage.requested.get(name, 0) - held.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons


def _lacks_room(requests: Mapping[str, int], node: NodeInfo) -> bool:
    """Whether a pod requesting ``requests`` is filtered out of ``node`` for its room: the
    pod count, or a request above what is free (cpu and memory compared even when not
    requested: an overcommitted node has no room)."""
    usage = node.usage
    return (
        usage.pods >= node.alloc_pods
        or requests.get("cpu", 0) > node.alloc_cpu - usage.cpu
        or requests.get("memory", 0) > node.alloc_memory - usage.memory
        or any(v > node.allocatable.get(k, 0) - usage.requested.get(k, 0)
               for k, v in requests.items() if k not in ("cpu", "memory"))
    )


def _least_allocated(pod_cpu: int, pod_mem: int, node: NodeInfo) -> int:
    """NodeResourcesFit LeastAllocated over cpu and memory, of a pod counting ``pod_cpu`` and
    ``pod_mem`` (its non-zero requests)."""
    usage = node.usage
    alloc, used = node.alloc_cpu, usage.nonzero_cpu + pod_cpu
    cpu = (alloc - used) * MAX_NODE_SCORE // alloc if alloc and used <= alloc else 0
    alloc, used = node.alloc_memory, usage.nonzero_memory + pod_mem
    mem = (alloc - used) * MAX_NODE_SCORE // alloc if alloc and used <= alloc else 0
    return (cpu + mem) // 2


def _balanced_allocation(pod_cpu: int, pod_mem: int, node: NodeInfo) -> int:
    """NodeResourcesBalancedAllocation (cpu and memory, the default resources) of a pod
    requesting ``pod_cpu`` and ``pod_mem`` (its own requests, not the non-zero ones:
    ``useRequested``), as kube-scheduler 1.35's ``balancedResourceScorer``: per resource the
    fraction requested on the node with the pod, capped at 1 (a resource the node has none
    of is left out); the standard deviation of the fractions, for two ``|f1 - f2| / 2``;
    ``int((1 - std) * 100)``. Float64 operations in Go's order, truncated as Go converts."""
    usage = node.usage
    fractions = []
    for alloc, used in ((node.alloc_cpu, usage.cpu + pod_cpu), (node.alloc_memory, usage.memory + pod_mem)):
        if alloc == 0:
            continue
        fractions.append(min(float(used) / float(alloc), 1.0))
    std = abs((fractions[0] - fractions[1]) / 2) if len(fractions) == 2 else 0.0
    return int((1 - std) * float(MAX_NODE_SCORE))


def _image_priority(total: int, slots: int) -> int:
    """ImageLocality's ``calculatePriority``: the summed scaled image sizes, clamped to
    [23 MiB, 1000 MiB per container], scaled to 0..100 (int64 arithmetic; both operands of
    the division have the same sign, so Python's floor is Go's truncation)."""
    high = IMAGE_MAX_CONTAINER_THRESHOLD * slots
    if total < IMAGE_MIN_THRESHOLD:
        total = IMAGE_MIN_THRESHOLD
    elif total > high:
        total = high
    return MAX_NODE_SCORE * (total - IMAGE_MIN_THRESHOLD) // (high - IMAGE_MIN_THRESHOLD)


# ---------------------------------------------------------------- the cache


@dataclass
class _PodEntry:
    node: str
    namespace: str
    labels: dict[str, str]
    requests: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    terminating: bool
    priority: int = 0
    host_ports: tuple[podaffinity.HostPort, ...] = ()
    anti: tuple[podaffinity.Term, ...] = ()
    # the pod's own terms that score incoming pods (InterPodAffinity's symmetric part):
    # preferred affinity (+weight), preferred anti-affinity (-weight), required affinity
    # (+HardPodAffinityWeight)
    scoring: tuple[tuple[int, podaffinity.Term], ...] = ()


# InterPodAffinityArgs.hardPodAffinityWeight default (pkg/scheduler/apis/config/v1/defaults.go)
HARD_POD_AFFINITY_WEIGHT = 1


class Cache:
    """Nodes and bound pods with incremental per-node aggregates.

    Not thread-safe: the caller serialises access (the scheduling loop holds a lock).
    """

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.order: list[str] = []
        self._usage: dict[str, Usage] = {}
        self._pods: dict[tuple[str, str], _PodEntry] = {}
        self._by_node: dict[str, dict[tuple[str, str], _PodEntry]] = {}  # node -> its bound pods
        # (namespace, selector key) -> (selector, node -> matching non-terminating pods)
        self._matches: dict[tuple[str, str], tuple[dict[str, Any] | None, Counter[str]]] = {}
        # per namespace, the counted selectors a pod's labels may match: by one of their
        # matchLabels pairs (a pod without that pair cannot match), or unanchored (no
        # matchLabels); so a bound pod is matched against its candidates, not every selector
        self._anchored: dict[str, dict[tuple[str, str], list[tuple[dict[str, Any] | None, Counter[str]]]]] = {}
        self._unanchored: dict[str, list[tuple[dict[str, Any] | None, Counter[str]]]] = {}
        # per namespace and label pair, its bound pods (in binding order), for counting a
        # new selector's matches among the pods carrying one of its pairs only
        self._labelled: dict[str, dict[tuple[str, str], dict[tuple[str, str], _PodEntry]]] = {}
        self._plans: dict[str, _Plan] = {}
        self._ports: dict[str, list[podaffinity.HostPort]] = {}  # node -> host ports in use
        self._anti: dict[tuple[str, str], _PodEntry] = {}  # bound pods with anti-affinity
        self._scoring: dict[tuple[str, str], _PodEntry] = {}  # bound pods with scoring terms
        self.ns_labels: dict[str, dict[str, str]] = {}  # for namespaceSelector terms
        # per pod shape (its requests), the nodes whose room it does not fit
        # (NodeResourcesFit's filter); per pod size (the non-zero cpu and memory
        # LeastAllocated counts, the requested ones BalancedAllocation counts), each node's
        # LeastAllocated plus BalancedAllocation score: kept per node as its pods or its
        # allocatable change
        self._no_room: dict[tuple[tuple[str, int], ...], tuple[dict[str, int], set[str]]] = {}
        self._resource_scores: dict[tuple[int, int, int, int], dict[str, int]] = {}
        # ImageLocality's image states (``cacheImpl.imageStates``): per image name, the size
        # of the first node to report it while any does, and the nodes reporting it
        self._images: dict[str, tuple[int, set[str]]] = {}

    def no_room(self, pod: PodInfo) -> set[str]:
        """The nodes whose room (requests and pod count) ``pod`` does not fit."""
        shape = tuple(sorted(pod.requests.items()))
        found = self._no_room.get(shape)
        if found is None:
            if len(self._no_room) > 256:
                self._no_room.clear()
            requests = dict(pod.requests)
            found = self._no_room[shape] = (
                requests, {name for name, node in self.nodes.items() if _lacks_room(requests, node)})
        return found[1]

    def resource_scores(self, pod: PodInfo) -> dict[str, int]:
        """Per node (filled in as asked by :func:`combine_scores`), ``pod``'s weighted
        NodeResourcesFit LeastAllocated plus NodeResourcesBalancedAllocation scores."""
        key = (pod.nonzero_cpu, pod.nonzero_memory, pod.requests.get("cpu", 0), pod.requests.get("memory", 0))
        found = self._resource_scores.get(key)
        if found is None:
            if len(self._resource_scores) > 256:
                self._resource_scores.clear()
            found = self._resource_scores[key] = {}
        return found

    def image_scores(self, pod: PodInfo, nodes: list[NodeInfo]) -> list[int] | None:
        """ImageLocality's Score per node of ``nodes`` (no NormalizeScore); None when it is 0
        on every node (no image of the pod is on any node). Per image of the pod on some
        node: its size times the share of all the nodes reporting it, truncated
        (``scaledImageScore``); per node the sum over the pod's images it reports (a
        repeated image counts each time), clamped and scaled (``calculatePriority``) by the
        count of containers and init containers."""
        if not pod.images or not self._images:
            return None
        total = len(self.nodes)
        scaled: dict[str, int] = {}
        for image in pod.images:
            state = self._images.get(image)
            if state is not None:
                scaled[image] = int(float(state[0]) * (len(state[1]) / total))
        if not scaled:
            return None
        slots = pod.image_slots
        low = _image_priority(0, slots)
        out = []
        for nd in nodes:
            held = nd.images
            out.append(_image_priority(sum(scaled[i] for i in pod.images if i in held), slots) if held else low)
        return out

    def _index_images(self, name: str, old: Mapping[str, int], new: Mapping[str, int]) -> None:
        """A node's images changed: ``removeNodeImageStates`` of its old ones, then
        ``addNodeImageStates`` of its new ones (an image no node reports any more is
        dropped, so its size is the next reporter's)."""
        for image in old:
            state = self._images.get(image)
            if state is not None:
                state[1].discard(name)
                if not state[1]:
                    del self._images[image]
        for image, size in new.items():
            state = self._images.get(image)
            if state is None:
                self._images[image] = (size, {name})
            else:
                state[1].add(name)

    def _changed(self, name: str) -> None:
        """A node's pods or its info changed: what is kept per pod shape follows."""
        node = self.nodes.get(name)
        for requests, names in self._no_room.values():
            if node is not None and _lacks_room(requests, node):
                names.add(name)
            else:
                names.discard(name)
        for scores in self._resource_scores.values():
            scores.pop(name, None)

    def plan(self, pod: PodInfo) -> _Plan:
        """The static part of scheduling ``pod`` (filters and scores that depend only on
        the nodes and the pod's shape), cached until a node changes."""
        found = self._plans.get(pod.signature)
        if found is None:
            found = _make_plan(pod, [self.nodes[n] for n in self.order])
            if len(self._plans) > 10_000:
                self._plans.clear()
            self._plans[pod.signature] = found
        return found

    # nodes
    def set_node(self, node: Mapping[str, Any]) -> bool:
        """Add or update a node; whether the update may let an unschedulable pod fit, as
        upstream's nodeSchedulingPropertiesChange decides (pkg/scheduler/eventhandlers.go):
        a new node, or a change of unschedulable, allocatable, labels, taints, condition
        statuses or annotations. An update that changes none of what the filters and
        scores read (a status write) keeps the cached plans."""
        name = (node.get("metadata") or {}).get("name", "")
        usage = self._usage.setdefault(name, Usage())
        info = NodeInfo.from_node(node, usage)
        old = self.nodes.get(name)
        if (old.images if old is not None else {}) != info.images:
            # ImageLocality reads them, no filter does: no requeueing for them alone
            self._index_images(name, old.images if old is not None else {}, info.images)
        if old is None:
            self.order.append(name)
        elif (old.labels == info.labels and old.taints == info.taints and old.allocatable == info.allocatable
              and old.unschedulable == info.unschedulable and old.ready == info.ready):
            # equal for every filter and the plans' scores: the info and the plans holding it stay
            changed = old.conditions != info.conditions or old.annotations != info.annotations
            old.conditions, old.annotations, old.images = info.conditions, info.annotations, info.images
            return changed
        self.nodes[name] = info
        self._plans.clear()
        self._changed(name)
        return True

    def remove_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is not None:
            self._index_images(name, old.images, {})
            self.order.remove(name)
            self._plans.clear()
            self._changed(name)

    # pods
    def bound(self, namespace: str, name: str) -> str | None:
        entry = self._pods.get((namespace, name))
        return entry.node if entry else None

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """Account a pod bound to a node (idempotent); unbound pods are ignored."""
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", "default"), meta.get("name", ""))
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in ("Succeeded", "Failed"):
            self.remove_pod(*key)
            return
        terminating = bool(meta.get("deletionTimestamp"))
        labels = meta.get("labels") or {}
        old = self._pods.get(key)
        if old and old.node == node and old.terminating == terminating and old.labels == labels:
            return
        info = PodInfo.from_pod(pod)
        self.add_assumed(info, node, terminating=terminating)

    def add_assumed(self, pod: PodInfo, node: str, *, terminating: bool = False) -> None:
        key = (pod.namespace, pod.name)
        self.remove_pod(*key)
        entry = _PodEntry(
            node, pod.namespace, pod.labels, pod.requests, pod.nonzero_cpu, pod.nonzero_memory,
            terminating, pod.priority, tuple(pod.host_ports), tuple(pod.anti_affinity),
            tuple(pod.preferred_pods) + tuple((HARD_POD_AFFINITY_WEIGHT, t) for t in pod.affinity),
        )
        self._pods[key] = entry
        self._by_node.setdefault(node, {})[key] = entry
        labelled = self._labelled.setdefault(pod.namespace, {})
        for pair in entry.labels.items():
            labelled.setdefault(pair, {})[key] = entry
        if entry.host_ports:
            self._ports.setdefault(node, []).extend(entry.host_ports)
        if entry.anti:
            self._anti[key] = entry
        if entry.scoring:
            self._scoring[key] = entry
        usage = self._usage.setdefault(node, Usage())
        usage.requested.update(entry.requests)
        usage.cpu += entry.requests.get("cpu", 0)
        usage.memory += entry.requests.get("memory", 0)
        usage.nonzero_cpu += entry.nonzero_cpu
        usage.nonzero_memory += entry.nonzero_memory
        usage.pods += 1
        self._changed(node)
        if not terminating:
            for selector, counts in self._candidates(pod.namespace, entry.labels):
                if match_label_selector(selector, entry.labels):
                    counts[node] += 1

    def remove_pod(self, namespace: str, name: str) -> None:
        entry = self._pods.pop((namespace, name), None)
        if entry is None:
            return
        on_node = self._by_node[entry.node]
        del on_node[(namespace, name)]
        if not on_node:
            del self._by_node[entry.node]
        labelled = self._labelled[namespace]
        for pair in entry.labels.items():
            holding = labelled[pair]
            del holding[(namespace, name)]
            if not holding:
                del labelled[pair]
        self._anti.pop((namespace, name), None)
        self._scoring.pop((namespace, name), None)
        for port in entry.host_ports:
            self._ports[entry.node].remove(port)
        usage = self._usage[entry.node]
        usage.requested.subtract(entry.requests)
        usage.cpu -= entry.requests.get("cpu", 0)
        usage.memory -= entry.requests.get("memory", 0)
        usage.nonzero_cpu -= entry.nonzero_cpu
        usage.nonzero_memory -= entry.nonzero_memory
        usage.pods -= 1
        self._changed(entry.node)
        if not entry.terminating:
            for selector, counts in self._candidates(namespace, entry.labels):
                if match_label_selector(selector, entry.labels):
                    counts[entry.node] -= 1

    def _candidates(self, namespace: str, labels: Mapping[str, str],
                    ) -> list[tuple[dict[str, Any] | None, Counter[str]]]:
        """The counted selectors of ``namespace`` that may match ``labels``."""
        found = list(self._unanchored.get(namespace, ()))
        anchored = self._anchored.get(namespace)
        if anchored:
            for pair in labels.items():
                more = anchored.get(pair)
                if more:
                    found += more
        return found

    def ports_used(self, node: str) -> list[podaffinity.HostPort]:
        return self._ports.get(node, [])

    def affinity_state(self, pod: PodInfo) -> podaffinity.State | None:
        """The InterPodAffinity state of one cycle, or None when nothing constrains the pod."""
        if not (pod.affinity or pod.anti_affinity or self._anti):
            return None
        labels = {name: info.labels for name, info in self.nodes.items()}
        existing = (podaffinity.Existing(e.node, e.namespace, e.labels) for e in self._pods.values())
        with_anti = [podaffinity.Existing(e.node, e.namespace, e.labels, list(e.anti))
                     for e in self._anti.values()]
        found = podaffinity.state(pod.namespace, pod.labels, affinity=pod.affinity,
                                  anti=pod.anti_affinity, pods=existing, with_anti=with_anti,
                                  node_labels=labels, ns_labels=self.ns_labels)
        return None if found.empty else found

    @property
    def scores_interpod(self) -> bool:
        """Whether some bound pod's own terms score incoming pods."""
        return bool(self._scoring)

    def interpod_scores(self, pod: PodInfo, nodes: list[NodeInfo]) -> list[float]:
        """InterPodAffinity Score + NormalizeScore (interpodaffinity/scoring.go): per node, the
        weights of the pod's preferred terms whose selected pods share its domain, plus the
        weights of the bound pods' terms that select the pod (their preferred terms, and
        their required affinity at HardPodAffinityWeight), counted in their node's domain;
        scaled to 0..100 between the lowest and the highest node."""
        symmetric: Counter[tuple[str, str]] = Counter()  # (topologyKey, value) -> weight
        for e in self._scoring.values():
            node = self.nodes.get(e.node)
            if node is None:
                continue
            for weight, term in e.scoring:
                value = node.labels.get(term.topology_key)
                if value is not None and term.selects(pod.namespace, pod.labels, self.ns_labels):
                    symmetric[(term.topology_key, value)] += weight
        per_term: list[Counter[str]] = []
        for _, term in pod.preferred_pods:
            domains: Counter[str] = Counter()
            for e in self._pods.values():
                node = self.nodes.get(e.node)
                if node is not None and term.topology_key in node.labels and term.selects(
                        e.namespace, e.labels, self.ns_labels):
                    domains[node.labels[term.topology_key]] += 1
            per_term.append(domains)
        raw = []
        for n in nodes:
            total = 0
            for (weight, term), domains in zip(pod.preferred_pods, per_term, strict=True):
                value = n.labels.get(term.topology_key)
                if value is not None:
                    total += weight * domains.get(value, 0)
            for (key, value), weight in symmetric.items():
                if n.labels.get(key) == value:
                    total += weight
            raw.append(total)
        lo, hi = min(raw, default=0), max(raw, default=0)
        if hi == lo:
            return [0.0] * len(raw)
        return [MAX_NODE_SCORE * (r - lo) / (hi - lo) for r in raw]

    def pods_on(self, node: str) -> list[tuple[tuple[str, str], _PodEntry]]:
        return list(self._by_node.get(node, {}).items())

    def matching(self, namespace: str, spread: Spread) -> Counter[str]:
        """Per node, the bound non-terminating pods of ``namespace`` matching the selector."""
        mkey = (namespace, spread.selector_key)
        found = self._matches.get(mkey)
        if found is None:
            match_labels = (spread.selector or {}).get("matchLabels") or {}
            anchor = next(iter(sorted(match_labels.items()))) if match_labels else None
            # a pod the selector matches carries its anchor pair
            candidates: Iterable[_PodEntry] = (
                self._pods.values() if anchor is None
                else self._labelled.get(namespace, {}).get(anchor, {}).values())
            counts: Counter[str] = Counter()
            for e in candidates:
                if e.namespace == namespace and not e.terminating and match_label_selector(
                    spread.selector, e.labels
                ):
                    counts[e.node] += 1
            found = (spread.selector, counts)
            self._matches[mkey] = found
            if anchor is not None:
                self._anchored.setdefault(namespace, {}).setdefault(anchor, []).append(found)
            else:
                self._unanchored.setdefault(namespace, []).append(found)
        return found[1]


# ---------------------------------------------------------------- topology spread


def _spread_eligible(pod: PodInfo, spread_list: list[Spread], node: NodeInfo) -> bool:
    """Whether a node's pods count for the pod's constraints (PreFilter of PodTopologySpread)."""
    for s in spread_list:
        if s.topology_key not in node.labels:
            return False
    if any(s.honor_affinity for s in spread_list) and not matches_node_affinity(pod, node):
        return False
    if any(s.honor_taints for s in spread_list):
        for taint in node.taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not tolerations.tolerated(
                taint, pod.tolerations
            ):
                return False
    return True


@dataclass
class _SpreadState:
    spread: Spread
    # matching pods per topology domain among eligible nodes: only the domains holding
    # some (a domain of ``domains`` missing here holds none)
    domain_counts: dict[str, int]
    min_match: int
    weight: float
    domains: set[str] = field(default_factory=set)  # every domain among eligible nodes
    _all: dict[str, int] | None = None

    def all_counts(self) -> dict[str, int]:
        """Matching pods in every domain, those without any at 0 (built once; not to be changed)."""
        if self._all is None:
            self._all = dict.fromkeys(self.domains, 0)
            self._all.update(self.domain_counts)
        return self._all


def _spread_states(pod: PodInfo, cache: Cache, plan: _Plan | None = None) -> list[_SpreadState]:
    """Per constraint, matching pods per topology domain among eligible nodes.

    Counted over the nodes holding matching pods, not over every domain: a domain
    without any counts 0, so the minimum is 0 unless every domain holds some."""
    plan = plan or cache.plan(pod)
    eligible = plan.eligible
    counted: list[dict[str, int]] = [{} for _ in pod.spreads]
    # the constraints sharing a selector (spotguard's three) walk its matching pods once
    groups: dict[str, list[int]] = {}
    for idx, s in enumerate(pod.spreads):
        groups.setdefault(s.selector_key, []).append(idx)
    for group in groups.values():
        keyed = [(pod.spreads[idx].topology_key, counted[idx]) for idx in group]
        for node_name, cnt in cache.matching(pod.namespace, pod.spreads[group[0]]).items():
            if cnt:
                node = eligible.get(node_name)
                if node is not None:
                    labels = node.labels
                    for key, domains in keyed:
                        value = labels[key]
                        domains[value] = domains.get(value, 0) + cnt
    states = []
    for idx, s in enumerate(pod.spreads):
        all_domains = plan.domains[idx]
        domains = counted[idx]
        if not all_domains:
            min_match = 0
        elif s.hard and len(all_domains) < s.min_domains:
            min_match = 0  # fewer domains than minDomains: the global minimum is 0
        elif len(domains) < len(all_domains):
            min_match = 0  # a domain without matching pods
        else:
            min_match = min(domains.values())
        states.append(_SpreadState(s, domains, min_match, math.log(len(all_domains) + 2), all_domains))
    return states


def filter_spread(pod: PodInfo, node: NodeInfo, states: list[_SpreadState]) -> str | None:
    for st in states:
        s = st.spread
        if not s.hard:
            continue
        value = node.labels.get(s.topology_key)
        if value is None:
            return "node(s) didn't match pod topology spread constraints (missing required label)"
        skew = st.domain_counts.get(value, 0) + s.self_match - st.min_match
        if skew > s.max_skew:
            return "node(s) didn't match pod topology spread constraints"
    return None


# ---------------------------------------------------------------- scores


def score_least_allocated(pod: PodInfo, node: NodeInfo) -> float:
    """NodeResourcesFit LeastAllocated over cpu and memory (weight 1 each)."""
    total = 0.0
    for alloc, used in (
        (node.allocatable.get("cpu", 0), node.usage.nonzero_cpu + pod.nonzero_cpu),
        (node.allocatable.get("memory", 0), node.usage.nonzero_memory + pod.nonzero_memory),
    ):
        if alloc == 0 or used > alloc:
            continue
        total += (alloc - used) * MAX_NODE_SCORE // alloc
    return total // 2


def score_balanced_allocation(pod: PodInfo, node: NodeInfo) -> int:
    """NodeResourcesBalancedAllocation's score of ``pod`` on ``node`` (0..100; 0 for a pod
    requesting neither cpu nor memory, which the plugin skips)."""
    cpu, mem = pod.requests.get("cpu", 0), pod.requests.get("memory", 0)
    return _balanced_allocation(cpu, mem, node) if cpu or mem else 0


def score_image_locality(pod: PodInfo, node: NodeInfo, cache: Cache) -> int:
    """ImageLocality's score of ``pod`` on ``node``, a node of ``cache`` (0..100)."""
    found = cache.image_scores(pod, [node])
    return found[0] if found is not None else 0


def score_preferred_affinity(pod: PodInfo, node: NodeInfo) -> float:
    return float(
        sum(w for w, term in pod.preferred if match_node_selector_term(term, node.name, node.labels))
    )


def score_prefer_no_schedule(pod: PodInfo, node: NodeInfo) -> float:
    return float(
        sum(
            1
            for t in node.taints
            if t.effect == "PreferNoSchedule" and not tolerations.tolerated(t, pod.tolerations)
        )
    )


def _score_spread_terms(pod: PodInfo, nodes: list[NodeInfo], states: list[_SpreadState], cache: Cache,
                        plan: _Plan) -> list[int | None]:
    """PodTopologySpread's raw score per node (None: a node lacking some constraint's key),
    over several ScheduleAnyway constraints: per node, each soft constraint's term summed
    in the constraints' order, rounded; a term is the matching pods on the node (hostname)
    or in its domain, times the constraint's weight, plus maxSkew - 1.

    Worked out once per distinct combination of the nodes' domains (the plan's
    :meth:`_Plan.combos`), with no matching pod on the node, and again for each node
    holding matching pods of a hostname constraint."""
    # per soft constraint: its index in the combination, its term per domain (or per node
    # for the hostname), the term where none is listed, whether per node
    terms: list[tuple[int, dict[Any, float], float, bool]] = []
    hosted: set[str] = set()
    for i, st in enumerate(states):
        x = st.spread
        if x.hard:
            continue
        extra = x.max_skew - 1
        if x.topology_key == HOSTNAME:
            by_node = {name: c * st.weight + extra for name, c in cache.matching(pod.namespace, x).items()}
            hosted.update(by_node)
            terms.append((i, by_node, 0 * st.weight + extra, True))
        else:
            terms.append((i, {v: c * st.weight + extra for v, c in st.domain_counts.items()}, extra, False))

    def exact(combo: tuple[str | bool | None, ...], name: str | None) -> int | None:
        score = 0.0
        for i, table, default, per_node in terms:
            value = combo[i]
            if value is None:
                return None
            score += table.get(name if per_node else value, default)
        return round(score)

    combos, distinct = plan.combos()
    if len(distinct) > len(nodes):  # as many domains as nodes: nothing shared
        return [exact(combos[n.name], n.name) for n in nodes]
    memo = {combo: exact(combo, None) for combo in distinct}
    if not hosted:
        return [memo[combos[n.name]] for n in nodes]
    return [exact(combos[n.name], n.name) if n.name in hosted else memo[combos[n.name]] for n in nodes]


def score_spread(
    pod: PodInfo, nodes: list[NodeInfo], states: list[_SpreadState], cache: Cache, plan: _Plan | None = None,
) -> list[float]:
    """PodTopologySpread Score + NormalizeScore for ScheduleAnyway constraints, per node of
    ``nodes`` (a node missing a constraint's topology label is ignored: 0)."""
    soft = [st for st in states if not st.spread.hard]
    if not soft:
        return [0.0] * len(nodes)
    raw: list[int | None]
    if len(soft) == 1 and soft[0].spread.topology_key != HOSTNAME:
        # one constraint on a wide domain (zone): the score depends on the domain only
        st = soft[0]
        key = st.spread.topology_key
        extra = st.spread.max_skew - 1
        by_domain = {v: round(c * st.weight + extra) for v, c in st.domain_counts.items()}
        zero = round(extra)
        raw = [None if (value := n.labels.get(key)) is None else by_domain.get(value, zero) for n in nodes]
    else:
        raw = _score_spread_terms(pod, nodes, states, cache, plan or cache.plan(pod))
    counted = [r for r in raw if r is not None]
    lo = min(counted, default=0)
    hi = max(counted, default=0)
    if hi == 0:
        return [0.0 if r is None else float(MAX_NODE_SCORE) for r in raw]
    top = hi + lo
    return [0.0 if r is None else float(MAX_NODE_SCORE * (top - r) // hi) for r in raw]


# ---------------------------------------------------------------- one scheduling cycle


@dataclass
class Result:
    node: str | None
    feasible: int = 0
    # why nodes failed: those searched; every node's static filters too when none fits
    reasons: Counter[str] = field(default_factory=Counter)
    next_start: int = 0
    # the feasible nodes searched and their total scores (when more than one was found)
    scored: tuple[list[NodeInfo], list[float]] = field(default_factory=lambda: ([], []))

    @property
    def scores(self) -> dict[str, float]:
        """Each scored node's total (built on demand: the loop needs only the best)."""
        return {nd.name: t for nd, t in zip(*self.scored, strict=True)}

    def message(self, total_nodes: int) -> str:
        parts = sorted(f"{count} {reason}" for reason, count in self.reasons.items())
        text = f"0/{total_nodes} nodes are available"
        return text + (": " + ", ".join(parts) + "." if parts else ".")


def num_feasible_nodes_to_find(total: int, percentage: int = 0) -> int:
    """percentageOfNodesToScore (0 = the adaptive default)."""
    if total < MIN_FEASIBLE_NODES_TO_FIND:
        return total
    if percentage <= 0:
        percentage = max(50 - total // 125, MIN_FEASIBLE_NODES_PERCENTAGE)
    return max(total * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def filter_node(pod: PodInfo, node: NodeInfo, states: list[_SpreadState]) -> list[str]:
    """All filters for one node; the reasons it fails (empty when it fits)."""
    reason = static_reason(pod, node)
    if reason:
        return [reason]
    reasons = filter_resources(pod, node)
    if reasons:
        return reasons
    reason = filter_spread(pod, node, states)
    return [reason] if reason else []


def static_reason(pod: PodInfo, node: NodeInfo) -> str | None:
    """The first static filter the node fails (Ready, cordon, taints, node affinity and selector)."""
    for f in (filter_ready, filter_unschedulable, filter_taints, filter_node_affinity):
        reason = f(pod, node)
        if reason:
            return reason
    return None


def loaded(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> NodeInfo:
    """The node with ``pods`` bound to it: their requests and their count in its usage."""
    info = NodeInfo.from_node(node)
    for p in pods:
        info.usage.requested.update(PodInfo.from_pod(p).requests)
        info.usage.pods += 1
    return info


def first_fit(pod: PodInfo, nodes: Iterable[NodeInfo]) -> NodeInfo | None:
    """The first node that passes the static filters and has room for the pod, which then counts
    there; None when none does. No spread, inter-pod affinity or host ports: the node
    autoscalers' simulation of where a pod would go, not the scheduler's choice."""
    for node in nodes:
        if static_reason(pod, node) is None and not filter_resources(pod, node):
            node.usage.requested.update(pod.requests)
            node.usage.pods += 1
            return node
    return None


@dataclass
class _Plan:
    nodes: list[NodeInfo]  # nodes passing the static filters, in cache order
    affinity: dict[str, float] | None  # raw preferred node affinity scores
    taints: dict[str, float] | None  # untolerated PreferNoSchedule taints
    eligible: dict[str, NodeInfo]  # nodes counted for topology spreading
    domains: list[set[str]]  # per constraint, the domains among eligible nodes
    pod: PodInfo
    all_nodes: list[NodeInfo]
    _reasons: Counter[str] | None = None
    _combos: dict[str, tuple[str | bool | None, ...]] | None = None
    _combo_set: set[tuple[str | bool | None, ...]] | None = None

    def combos(self) -> tuple[dict[str, tuple[str | bool | None, ...]], set[tuple[str | bool | None, ...]]]:
        """Per node passing the static filters, what PodTopologySpread's score reads of its
        labels, per constraint of the pod (the plan's pods share their topology keys): the
        domain, True for the hostname (counted per node), None where the key is missing;
        and the distinct ones (worked out on first use)."""
        if self._combos is None or self._combo_set is None:
            keys = [sp.topology_key for sp in self.pod.spreads]
            self._combos = {
                n.name: tuple((True if key == HOSTNAME else v) if (v := n.labels.get(key)) is not None else None
                              for key in keys)
                for n in self.nodes
            }
            self._combo_set = set(self._combos.values())
        return self._combos, self._combo_set

    @property
    def reasons(self) -> Counter[str]:
        """Why the other nodes fail the static filters (counted on first use)."""
        if self._reasons is None:
            self._reasons = Counter(r for n in self.all_nodes if (r := static_reason(self.pod, n)))
        return self._reasons


def pinned_node_names(pod: PodInfo) -> set[str] | None:
    """NodeAffinity's PreFilter result: the node names the required terms name with
    ``matchFields`` ``metadata.name In`` (a DaemonSet pod's), or None when some term names
    none (every node is a candidate). Only these nodes can pass the filter
    (pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go PreFilter)."""
    if pod.required_terms is None:
        return None
    names: set[str] = set()
    for term in pod.required_terms:
        found: set[str] | None = None
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In":
                values = set(f.get("values") or [])
                found = values if found is None else found & values
        if found is None:
            return None
        names |= found
    return names


def _make_plan(pod: PodInfo, nodes: list[NodeInfo]) -> _Plan:
    passing: list[NodeInfo] = []
    # A pod pinned to named nodes visits only those (its PreFilter result); why the
    # others fail is worked out only if the pod fits nowhere.
    pinned = pinned_node_names(pod) if not pod.spreads else None
    candidates = nodes if pinned is None else [n for n in nodes if n.name in pinned]
    for node in candidates:
        if not static_reason(pod, node):
            passing.append(node)
    affinity = {n.name: score_preferred_affinity(pod, n) for n in passing} if pod.preferred else None
    taints = None
    if any(t.effect == "PreferNoSchedule" for n in passing for t in n.taints):
        taints = {n.name: score_prefer_no_schedule(pod, n) for n in passing}
    eligible: dict[str, NodeInfo] = {}
    domains: list[set[str]] = [set() for _ in pod.spreads]
    if pod.spreads:
        for n in nodes:
            if _spread_eligible(pod, pod.spreads, n):
                eligible[n.name] = n
                for i, sp in enumerate(pod.spreads):
                    domains[i].add(n.labels[sp.topology_key])
    return _Plan(passing, affinity, taints, eligible, domains, pod, nodes)


def feasible_nodes(pod: PodInfo, cache: Cache) -> set[str]:
    """Every node passing all filters (for tests and diagnostics)."""
    states = _spread_states(pod, cache) if pod.spreads else []
    affinity = cache.affinity_state(pod)
    return {
        n.name for n in cache.nodes.values()
        if not filter_node(pod, n, states)
        and not (pod.host_ports and podaffinity.ports_conflict(pod.host_ports, cache.ports_used(n.name)))
        and not (affinity is not None and affinity.reason(n.labels))
    }


@dataclass
class Preemption:
    node: str
    victims: list[tuple[str, str]]  # (namespace, name)


Budgets = list[tuple[str, dict[str, Any], int]]  # (namespace, selector, disruptionsAllowed)


def _violating(victims: list[tuple[tuple[str, str], _PodEntry]], budgets: Budgets) -> set[tuple[str, str]]:
    """The victims whose eviction would break a PodDisruptionBudget (filterPodsWithPDBViolation)."""
    left = [allowed for _, _, allowed in budgets]
    out = set()
    for key, e in victims:
        for i, (ns, selector, _) in enumerate(budgets):
            if ns == e.namespace and match_label_selector(selector, e.labels):
                left[i] -= 1
                if left[i] < 0:
                    out.add(key)
    return out


class _AffinityCheck:
    """InterPodAffinity's filter for one node with some of its pods removed, as
    SelectVictimsOnNode re-runs the filters (RemovePod / AddPod) while it picks victims.

    Counted once per preemption over every bound pod; a node's check subtracts the
    removed pods (all on that node, so in its domains)."""

    def __init__(self, pod: PodInfo, cache: Cache) -> None:
        self.pod, self.ns_labels = pod, cache.ns_labels
        self.anti = [Counter[str]() for _ in pod.anti_affinity]
        self.aff = [Counter[str]() for _ in pod.affinity]
        self.aff_total = [0 for _ in pod.affinity]
        self.own = [t.selects(pod.namespace, pod.labels, cache.ns_labels) for t in pod.affinity]
        self.forbidden: Counter[tuple[str, str]] = Counter()
        for e in cache._pods.values():
            labels = cache.nodes[e.node].labels if e.node in cache.nodes else None
            if labels is None:
                continue
            for i, t in enumerate(pod.anti_affinity):
                if t.topology_key in labels and t.selects(e.namespace, e.labels, self.ns_labels):
                    self.anti[i][labels[t.topology_key]] += 1
            for i, t in enumerate(pod.affinity):
                if t.selects(e.namespace, e.labels, self.ns_labels):
                    self.aff_total[i] += 1
                    if t.topology_key in labels:
                        self.aff[i][labels[t.topology_key]] += 1
            for key, value in self._forbids(e, labels):
                self.forbidden[(key, value)] += 1

    def _forbids(self, e: _PodEntry, labels: Mapping[str, str]) -> list[tuple[str, str]]:
        return [(t.topology_key, labels[t.topology_key]) for t in e.anti
                if t.topology_key in labels
                and t.selects(self.pod.namespace, self.pod.labels, self.ns_labels)]

    def passes(self, node: NodeInfo, removed: list[_PodEntry]) -> bool:
        labels = node.labels
        for i, t in enumerate(self.pod.anti_affinity):
            value = labels.get(t.topology_key)
            gone = sum(1 for e in removed if t.selects(e.namespace, e.labels, self.ns_labels))
            if value is not None and self.anti[i][value] - gone > 0:
                return False
        forbidden = Counter(self.forbidden)
        for e in removed:
            forbidden.subtract(self._forbids(e, labels))
        if any(n > 0 and labels.get(key) == value for (key, value), n in forbidden.items()):
            return False
        for i, t in enumerate(self.pod.affinity):
            value = labels.get(t.topology_key)
            if value is None:
                return False
            gone = sum(1 for e in removed if t.selects(e.namespace, e.labels, self.ns_labels))
            if self.aff[i][value] - gone <= 0 and (self.aff_total[i] - gone > 0 or not self.own[i]):
                return False
        return True


def _spread_passes(pod: PodInfo, node: NodeInfo, states: list[_SpreadState],
                   removed: list[_PodEntry], eligible: bool) -> bool:
    """PodTopologySpread's filter on ``node`` with ``removed`` (its pods) gone."""
    for st in states:
        s = st.spread
        if not s.hard:
            continue
        value = node.labels.get(s.topology_key)
        if value is None:
            return False
        counts = st.all_counts()
        gone = sum(1 for e in removed if eligible and e.namespace == pod.namespace
                   and match_label_selector(s.selector, e.labels))
        if gone:
            counts = {**counts, value: counts.get(value, 0) - gone}
        low = st.min_match
        if counts and not (s.hard and len(counts) < s.min_domains):
            low = min(counts.values())
        if counts.get(value, 0) + s.self_match - low > s.max_skew:
            return False
    return True


def preempt(pod: PodInfo, cache: Cache, budgets: Budgets | None = None,
            nominated: Mapping[str, Counter[str]] | None = None) -> Preemption | None:
    """DefaultPreemption, simplified: the node where evicting lower-priority pods lets ``pod``
    fit its requests, pod count, host ports, inter-pod (anti-)affinity and hard topology
    spread constraints, beside the pods already nominated there with at least its priority
    (``nominated``, as :func:`schedule` takes it: ``SelectVictimsOnNode`` runs the filters
    with nominated pods, so two preemptors do not count on the same freed room). On each
    node the candidates are reprieved
    (kept) highest priority first, those protected by a PodDisruptionBudget before the
    others, while the pod still fits; among nodes, the fewest budget violations win, then
    the lowest highest-victim priority, the lowest sum, the fewest victims. A budget is
    broken when no other node will do, as upstream.
    https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/#preemption
    """
    budgets = budgets or []
    if not pod.preempts:
        return None
    plan = cache.plan(pod)
    # built on first use: most unschedulable pods have no lower-priority pod to preempt
    lazy: dict[str, Any] = {}

    def check() -> _AffinityCheck | None:
        if "check" not in lazy:
            lazy["check"] = _AffinityCheck(pod, cache) if (
                pod.affinity or pod.anti_affinity or cache._anti) else None
        found: _AffinityCheck | None = lazy["check"]
        return found

    def spreads() -> list[_SpreadState]:
        if "spreads" not in lazy:
            lazy["spreads"] = (_spread_states(pod, cache, plan)
                               if any(sp.hard for sp in pod.spreads) else [])
        found: list[_SpreadState] = lazy["spreads"]
        return found

    best: tuple[tuple[int, int, int, int], Preemption] | None = None
    for node in plan.nodes:
        lower = sorted(((k, e) for k, e in cache.pods_on(node.name)
                        if e.priority < pod.priority and not e.terminating),
                       key=lambda ke: (-ke[1].priority, ke[0]))
        if not lower:
            continue
        held = (nominated or {}).get(node.name) or Counter()
        free = Counter({k: node.allocatable.get(k, 0) - node.usage.requested.get(k, 0) - held.get(k, 0)
                        for k in pod.requests})
        free_pods = node.allocatable.get("pods", 0) - node.usage.pods - held.get("pods", 0)
        ports = list(cache.ports_used(node.name))
        for _, e in lower:
            for k in pod.requests:
                free[k] += e.requests.get(k, 0)
            free_pods += 1
            for port in e.host_ports:
                ports.remove(port)

        removed = dict(lower)

        def fits(free: Counter[str] = free, free_pods: int = free_pods,
                 ports: list[podaffinity.HostPort] = ports, node: NodeInfo = node,
                 removed: dict[tuple[str, str], _PodEntry] = removed) -> bool:
            return (free_pods >= 1 and all(free[k] >= v for k, v in pod.requests.items())
                    and not podaffinity.ports_conflict(pod.host_ports, ports)
                    and ((aff := check()) is None or aff.passes(node, list(removed.values())))
                    and (not (states := spreads()) or _spread_passes(
                        pod, node, states, list(removed.values()), node.name in plan.eligible)))

        if not fits():
            continue
        victims = []
        protected = _violating(lower, budgets)
        lower.sort(key=lambda ke: ke[0] not in protected)  # stable: by priority within each group
        for key, e in lower:  # highest priority first: keep each one that still lets the pod fit
            for k in pod.requests:
                free[k] -= e.requests.get(k, 0)
            free_pods -= 1
            ports.extend(e.host_ports)
            del removed[key]
            if fits(free, free_pods, ports, node, removed):
                continue
            for k in pod.requests:
                free[k] += e.requests.get(k, 0)
            free_pods += 1
            for port in e.host_ports:
                ports.remove(port)
            removed[key] = e
            victims.append((key, e))
        if not victims:
            continue
        rank = (len(_violating(victims, budgets)), max(e.priority for _, e in victims),
                sum(e.priority for _, e in victims), len(victims))
        if best is None or rank < best[0]:
            best = (rank, Preemption(node.name, [k for k, _ in victims]))
    return best[1] if best else None


def schedule(
    pod: PodInfo,
    cache: Cache,
    *,
    start: int = 0,
    rng: random.Random | None = None,
    percentage: int = 0,
    nominated: Mapping[str, Counter[str]] | None = None,
) -> Result:
    """Pick the best node for ``pod``: filters, then weighted normalised scores.

    ``nominated``: per node, the requests (and ``pods``, their count) of the pods nominated
    to it (``status.nominatedNodeName``, a preemptor waiting for its victims to go) whose
    priority is at least ``pod``'s: the filters count them as if bound
    (``RunFilterPluginsWithNominatedPods``), so a lower-priority pod does not take the room
    a preemption freed."""
    total = len(cache.order)
    result = Result(node=None)
    if total == 0:
        return result
    plan = cache.plan(pod)
    affinity = cache.affinity_state(pod)
    states = _spread_states(pod, cache, plan) if pod.spreads else []
    hard = [st for st in states if st.spread.hard]
    want = num_feasible_nodes_to_find(total, percentage)
    nodes = plan.nodes
    n = len(nodes)
    feasible: list[NodeInfo] = []
    processed = 0
    start = start % n if n else 0
    ordered = nodes[start:] + nodes[:start]
    no_room = cache.no_room(pod)
    if not (no_room or nominated or hard or pod.host_ports or affinity is not None):
        # every node has room and no other filter is left to run: the first found
        ordered, feasible = [], ordered[:want]
        processed = len(feasible)
    for node in ordered:
        processed += 1
        if node.name in no_room:
            result.reasons.update(filter_resources(pod, node))
            continue
        held = nominated.get(node.name) if nominated else None
        if held:
            reasons = filter_resources(pod, node, held)
            if reasons:
                result.reasons.update(reasons)
                continue
        if hard:
            reason = filter_spread(pod, node, hard)
            if reason:
                result.reasons[reason] += 1
                continue
        if pod.host_ports and podaffinity.ports_conflict(pod.host_ports, cache.ports_used(node.name)):
            result.reasons["node(s) didn't have free ports for the requested pod ports"] += 1
            continue
        if affinity is not None:
            reason = affinity.reason(node.labels)
            if reason:
                result.reasons[reason] += 1
                continue
        feasible.append(node)
        if len(feasible) >= want:
            break
    result.next_start = (start + processed) % n if n else 0
    result.feasible = len(feasible)
    if not feasible:
        result.reasons.update(plan.reasons)
        return result
    if len(feasible) == 1:
        result.node = feasible[0].name
        return result
    scores = combine_scores(pod, feasible, states, cache, plan)
    result.scored = (feasible, scores)
    best = max(scores)
    top = [nd.name for nd, t in zip(feasible, scores, strict=True) if t == best]
    result.node = top[0] if rng is None else rng.choice(top)
    return result


def combine_scores(
    pod: PodInfo, nodes: list[NodeInfo], states: list[_SpreadState], cache: Cache, plan: _Plan,
) -> list[float]:
    """Weighted sum of the normalised scores of the feasible nodes, in their order."""
    fit, balanced = WEIGHTS["fit"], WEIGHTS["balanced"]
    base = WEIGHTS["taint"] * MAX_NODE_SCORE if plan.taints is None else 0
    pod_cpu, pod_mem = pod.nonzero_cpu, pod.nonzero_memory
    req_cpu, req_mem = pod.requests.get("cpu", 0), pod.requests.get("memory", 0)
    if not (req_cpu or req_mem):
        # BalancedAllocation's PreScore skips a pod requesting neither (isBestEffortPod,
        # kubernetes/kubernetes#129138): it scores no node
        balanced = 0
    kept = cache.resource_scores(pod)  # LeastAllocated and BalancedAllocation, kept per node
    for nd in nodes:
        if nd.name not in kept:
            kept[nd.name] = fit * _least_allocated(pod_cpu, pod_mem, nd) + (
                balanced * _balanced_allocation(req_cpu, req_mem, nd) if balanced else 0)
    totals: list[float] = [kept[nd.name] + base for nd in nodes]
    images = cache.image_scores(pod, nodes)
    if images is not None:
        w = WEIGHTS["image"]
        totals = [t + w * x for t, x in zip(totals, images, strict=True)]
    if plan.affinity is not None:
        totals = _add_normalized(totals, [plan.affinity[nd.name] for nd in nodes], WEIGHTS["affinity"])
    if plan.taints is not None:
        totals = _add_normalized(totals, [plan.taints[nd.name] for nd in nodes], WEIGHTS["taint"],
                                 reverse=True)
    if any(not st.spread.hard for st in states):
        w = WEIGHTS["spread"]
        totals = [t + w * x for t, x in zip(totals, score_spread(pod, nodes, states, cache, plan),
                                                  strict=True)]
    if pod.preferred_pods or cache.scores_interpod:
        w = WEIGHTS["interpod"]
        totals = [t + w * x for t, x in zip(totals, cache.interpod_scores(pod, nodes), strict=True)]
    return totals


def _add_normalized(totals: list[float], raw: list[float], weight: int, reverse: bool = False) -> list[float]:
    """DefaultNormalizeScore (scale by the maximum, optionally reversed), weighted, added."""
    top = max(raw, default=0)
    if top == 0:
        score: float = MAX_NODE_SCORE if reverse else 0
        return [t + weight * score for t in totals]
    if reverse:
        return [t + weight * (MAX_NODE_SCORE - MAX_NODE_SCORE * v / top) for t, v in zip(totals, raw, strict=True)]
    return [t + weight * (MAX_NODE_SCORE * v / top) for t, v in zip(totals, raw, strict=True)]
