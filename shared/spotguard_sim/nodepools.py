"""Karpenter's NodePool arithmetic (pure): offerings a NodePool allows, the labels of the
node it launches, which pods a launch can hold, and the offering it picks.

Sources (kubernetes-sigs/karpenter and aws/karpenter-provider-aws; docs/sim.md):
- requirements are NodeSelectorRequirements over well-known labels
  (``pkg/apis/v1/labels.go``; the provider's ``karpenter.k8s.aws/instance-*`` labels);
  a NodePool without a ``karpenter.sh/capacity-type`` requirement allows every
  capacity type its offerings have;
- "If a NodePool is compatible with multiple capacity types, Karpenter will prioritize
  reserved capacity, followed by spot, then finally on-demand" (docs concepts/nodepools.md);
  within a capacity type the fleet request picks the lowest price (on-demand
  ``lowest-price``; spot ``price-capacity-optimized``, priced here by price alone);
- ``weight``: NodePools are tried from the highest weight down;
- ``limits``: a NodePool launches nothing that would take its nodes' capacity past them;
- the simulated cloud holds no capacity reservations, so ``reserved`` offers nothing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from spotguard.policy import quantities

from spotguard_sim import catalogue, scheduler

CAPACITY_TYPE = "karpenter.sh/capacity-type"
NODEPOOL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
FAMILY = "karpenter.k8s.aws/instance-family"
CAPACITY_ORDER = {"reserved": 0, "spot": 1, "on-demand": 2}
OFFERED = ("spot", "on-demand")  # no capacity reservations in the simulated cloud
# startup taints Karpenter ignores when it decides whether a pod fits a new node
IGNORED_TAINTS = ("node.kubernetes.io/not-ready", "karpenter.sh/unregistered", "node.kubernetes.io/unreachable")
Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Offering:
    instance_type: catalogue.InstanceType
    capacity_type: str
    zone: str
    price: float

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.instance_type.name, self.capacity_type, self.zone)


def instance_labels(t: catalogue.InstanceType, capacity_type: str, zone: str) -> dict[str, str]:
    """The well-known labels of an offering, as Karpenter puts them on the node."""
    return {
        INSTANCE_TYPE: t.name,
        CAPACITY_TYPE: capacity_type,
        ZONE: zone,
        REGION: catalogue.REGION,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        FAMILY: t.family,
        "karpenter.k8s.aws/instance-category": t.category,
        "karpenter.k8s.aws/instance-generation": t.generation,
        "karpenter.k8s.aws/instance-size": t.size,
        "karpenter.k8s.aws/instance-cpu": str(t.vcpus),
        "karpenter.k8s.aws/instance-memory": str(t.memory_mib),
    }


def template(pool: Mapping[str, Any]) -> Obj:
    return dict((pool.get("spec") or {}).get("template") or {})


def requirements(pool: Mapping[str, Any]) -> list[Obj]:
    return list((template(pool).get("spec") or {}).get("requirements") or [])


def taints(pool: Mapping[str, Any]) -> list[Obj]:
    return list((template(pool).get("spec") or {}).get("taints") or [])


def startup_taints(pool: Mapping[str, Any]) -> list[Obj]:
    return list((template(pool).get("spec") or {}).get("startupTaints") or [])


def pool_labels(pool: Mapping[str, Any]) -> dict[str, str]:
    """The template's labels and the single-valued In requirements on keys no offering sets."""
    name = str((pool.get("metadata") or {}).get("name") or "")
    labels = {str(k): str(v) for k, v in ((template(pool).get("metadata") or {}).get("labels") or {}).items()}
    well_known = set(instance_labels(catalogue.TYPES["m5.large"], "spot", "x"))
    for req in requirements(pool):
        key = str(req.get("key") or "")
        values = list(req.get("values") or [])
        if key not in well_known and req.get("operator") == "In" and values:
            labels.setdefault(key, str(values[0]))
    labels[NODEPOOL] = name
    return labels


def weight(pool: Mapping[str, Any]) -> int:
    return int((pool.get("spec") or {}).get("weight") or 0)


def offerings(pool: Mapping[str, Any], prices: catalogue.Prices,
              unavailable: Iterable[tuple[str, str, str]] = ()) -> list[Offering]:
    """Every offering the NodePool's requirements allow, best first (capacity type, then price)."""
    reqs = requirements(pool)
    extra = pool_labels(pool)
    gone = set(unavailable)
    out = []
    for t in catalogue.TYPES.values():
        for capacity in OFFERED:
            for zone in catalogue.ZONES:
                labels = {**extra, **instance_labels(t, capacity, zone)}
                if not all(scheduler.match_requirement(r, labels) for r in reqs):
                    continue
                price = prices.hourly(t.name, capacity)
                if price is None or (t.name, capacity, zone) in gone:
                    continue
                out.append(Offering(t, capacity, zone, price))
    out.sort(key=lambda o: (CAPACITY_ORDER[o.capacity_type], o.price, o.instance_type.name, o.zone))
    return out


def node_labels(pool: Mapping[str, Any], offering: Offering, name: str) -> dict[str, str]:
    return {**pool_labels(pool), **instance_labels(offering.instance_type, offering.capacity_type, offering.zone),
            "kubernetes.io/hostname": name}


_CANDIDATES: dict[tuple[str, str, tuple[str, str, str]], scheduler.NodeInfo] = {}


def candidate(pool: Mapping[str, Any], offering: Offering) -> scheduler.NodeInfo:
    """The node an offering would become, as the scheduler sees it once Ready (read-only: cached
    per NodePool version and offering)."""
    meta = pool.get("metadata") or {}
    if not meta.get("uid"):
        return _candidate(pool, offering)
    key = (str(meta["uid"]), str(meta.get("resourceVersion") or ""), offering.key)
    found = _CANDIDATES.get(key)
    if found is None:
        if len(_CANDIDATES) > 20_000:
            _CANDIDATES.clear()
        found = _CANDIDATES[key] = _candidate(pool, offering)
    return found


def _candidate(pool: Mapping[str, Any], offering: Offering) -> scheduler.NodeInfo:
    t = offering.instance_type
    node = {"metadata": {"name": "", "labels": node_labels(pool, offering, "")},
            "spec": {"taints": [x for x in taints(pool) if x.get("key") not in IGNORED_TAINTS]},
            "status": {"allocatable": t.allocatable()}}
    return scheduler.NodeInfo.from_node(node)


def admits(pod: scheduler.PodInfo, node: scheduler.NodeInfo) -> bool:
    """The pod's node affinity and tolerations allow the node (resources aside)."""
    return scheduler.matches_node_affinity(pod, node) and scheduler.filter_taints(pod, node) is None


def relaxations(pod: scheduler.PodInfo) -> list[scheduler.PodInfo]:
    """The pod as Karpenter tries it: its heaviest preferred node affinity term treated as required,
    then (relaxing one term at a time) the next heaviest, and finally none
    (pkg/scheduling/requirements.go "Select heaviest preference and treat as a requirement";
    pkg/controllers/provisioning/scheduling/preferences.go removePreferredNodeAffinityTerm)."""
    ordered = [term for _, term in sorted(pod.preferred, key=lambda p: -p[0])]  # stable, as SliceStable
    out = []
    for term in ordered:
        wanted = list(term.get("matchExpressions") or [])
        terms = pod.required_terms or [{"matchExpressions": []}]
        strict = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), *wanted]} for t in terms]
        out.append(dataclasses.replace(pod, required_terms=strict))
    return [*out, pod]


def fits(requests: Mapping[str, int], pods: int, node: scheduler.NodeInfo) -> bool:
    if pods > node.allocatable.get("pods", 0):
        return False
    return all(want <= node.allocatable.get(name, 0) for name, want in requests.items() if want > 0)


@dataclasses.dataclass
class Claim:
    """A node being planned: its NodePool, its pods, and the offerings that still hold them all."""

    pool: Obj
    offerings: list[Offering]
    pods: list[scheduler.PodInfo] = dataclasses.field(default_factory=list)
    requests: Counter[str] = dataclasses.field(default_factory=Counter)
    overhead: Counter[str] = dataclasses.field(default_factory=Counter)
    overhead_pods: int = 0

    def total(self, extra: Mapping[str, int]) -> Counter[str]:
        out = Counter(self.requests)
        out.update(self.overhead)
        out.update(extra)
        return out

    def holding(self, pod: scheduler.PodInfo) -> list[Offering]:
        """The offerings that would hold this claim's pods and ``pod``."""
        want = self.total(pod.requests)
        count = len(self.pods) + 1 + self.overhead_pods
        return [o for o in self.offerings
                if admits(pod, cand := candidate(self.pool, o)) and fits(want, count, cand)]

    def add(self, pod: scheduler.PodInfo, holding: list[Offering]) -> None:
        self.pods.append(pod)
        self.requests.update(pod.requests)
        self.offerings = holding

    def best(self) -> Offering | None:
        return self.offerings[0] if self.offerings else None


@dataclasses.dataclass
class InFlight:
    """A NodeClaim still launching, as Karpenter's scheduling simulations see it (an in-flight
    state node): the node it will be, what is packed onto it so far and how many pods."""

    node: scheduler.NodeInfo
    requests: Counter[str]
    pods: int

    def take(self, pod: scheduler.PodInfo) -> bool:
        """The pod fits beside what the claim holds (as the provisioner packs a launching
        claim); it then counts there."""
        want = Counter(self.requests)
        want.update(pod.requests)
        if not (admits(pod, self.node) and fits(want, self.pods + 1, self.node)):
            return False
        self.requests, self.pods = want, self.pods + 1
        return True


def daemon_pods(daemonsets: Iterable[Mapping[str, Any]]) -> list[scheduler.PodInfo]:
    """The pod each DaemonSet would run on a new node (its template)."""
    out = []
    for ds in daemonsets:
        tmpl = (ds.get("spec") or {}).get("template") or {}
        out.append(scheduler.PodInfo.from_pod({"metadata": tmpl.get("metadata") or {}, "spec": tmpl.get("spec") or {}}))
    return out


def daemon_overhead(node: scheduler.NodeInfo, daemons: Iterable[scheduler.PodInfo]) -> tuple[Counter[str], int]:
    """What the DaemonSet pods that would run on the new node request, and how many they are
    (Karpenter and the Cluster Autoscaler reserve it)."""
    total: Counter[str] = Counter()
    count = 0
    for d in daemons:
        if admits(d, node):
            total.update(d.requests)
            count += 1
    return total, count


def within_limits(pool: Mapping[str, Any], used: Mapping[str, int], offering: Offering) -> bool:
    """Launching ``offering`` keeps the NodePool within ``spec.limits`` (``used``: its nodes' capacity)."""
    limits = quantities.parse_resources((pool.get("spec") or {}).get("limits") or {})
    if not limits:
        return True
    adds = quantities.parse_resources(offering.instance_type.capacity())
    return all(used.get(k, 0) + adds.get(k, 0) <= v for k, v in limits.items())
