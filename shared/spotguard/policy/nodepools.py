"""Whether a Karpenter NodePool can launch an on-demand node a given pod could run on (pure).

An on-demand floor is a requirement the node autoscaler must be able to meet: when no
on-demand node exists yet but a NodePool can launch one for the pod, the floor pod keeps
its on-demand requirement and waits (Pending) for Karpenter to launch the node, instead
of being placed on spot (which keeps Karpenter from ever launching it).

Karpenter's semantics (kubernetes-sigs/karpenter, read at its August 2026 head; see
docs/admission.md "Floors on autoscaled capacity"):

- A NodePool's requirements are ``spec.template.spec.requirements`` plus its template
  labels (each an ``In`` of its one value) and ``karpenter.sh/nodepool In [name]``
  (``pkg/controllers/provisioning/scheduling/nodeclaimtemplate.go`` NewNodeClaimTemplate).
- A pod fits a NodePool when the pod's requirements are compatible with the NodePool's
  (``pkg/scheduling/requirements.go`` Compatible with AllowUndefinedWellKnownLabels): a
  key the pod requires that the NodePool does not constrain is allowed when it is a
  well-known label (``pkg/apis/v1/labels.go`` WellKnownLabels, plus the AWS provider's
  ``karpenter.k8s.aws/*`` and ``topology.k8s.aws/zone-id``) or the pod's operator is
  ``NotIn``/``DoesNotExist``; otherwise it is denied ("label does not have known
  values"). A key both constrain must intersect (``Intersects``, with NotIn/DoesNotExist
  on both sides always compatible), and the pod tolerates the template's ``taints``
  (``nodeclaim.go`` ToleratesPod; ``startupTaints`` are not checked).
- No capacity-type requirement: ``karpenter.sh/capacity-type`` is a well-known label left
  undefined, so every capacity type is allowed, on-demand included (the v1 API has no
  defaulting: ``pkg/apis/v1/nodepool_defaults.go`` SetDefaults is empty; the pre-v1
  AWS webhook defaulted it to on-demand; either way on-demand can be launched).
- Requirement algebra (``pkg/scheduling/requirement.go``): In, NotIn, Exists,
  DoesNotExist; Gt and Lt as integer bounds.
- NodePools whose ``Ready`` condition is False are ignored (``provisioner.go`` "ignoring
  nodepool, not ready"); ``spec.limits`` stop launches once the NodePool's resources
  exceed them (``Limits.ExceededBy``; a limit of 0, or ``nodes: 0``, launches nothing).
  A NodePool with no status at all (not reconciled yet) is taken as ready.
- ``nodeSelectorTerms`` are ORed; Karpenter tries them one at a time
  (``preferences.go`` removeRequiredNodeAffinityTerm): any compatible term will do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import quantities
from spotguard.policy.tolerations import Taint, Toleration, tolerated
from spotguard.policy.views import PodView

GROUP = "karpenter.sh"
VERSION = "v1"
PLURAL = "nodepools"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
ON_DEMAND = "on-demand"
SPOT = "spot"

WELL_KNOWN = frozenset(
    {
        NODEPOOL_LABEL,
        CAPACITY_TYPE,
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "node.kubernetes.io/windows-build",
        "topology.k8s.aws/zone-id",
    }
)
WELL_KNOWN_PREFIXES = ("karpenter.k8s.aws/",)
# pod labels Karpenter translates to the well-known ones (labels.go NormalizedLabels)
NORMALIZED = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
    "beta.kubernetes.io/arch": "kubernetes.io/arch",
    "beta.kubernetes.io/os": "kubernetes.io/os",
    "beta.kubernetes.io/instance-type": "node.kubernetes.io/instance-type",
}
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def well_known(key: str) -> bool:
    return key in WELL_KNOWN or key.startswith(WELL_KNOWN_PREFIXES)


@dataclass(frozen=True)
class Requirement:
    """One key's allowed values: a set (``complement`` False) or everything but a set,
    with inclusive integer bounds (Karpenter's ``Requirement``)."""

    complement: bool
    values: frozenset[str] = frozenset()
    gte: int | None = None
    lte: int | None = None

    @classmethod
    def from_expression(cls, operator: str, values: Sequence[str]) -> Requirement | None:
        """None for an operator that is not a node selector operator (matches nothing)."""
        if operator == "In":
            return cls(False, frozenset(values))
        if operator == "NotIn":
            return cls(True, frozenset(values))
        if operator == "Exists":
            return cls(True)
        if operator == "DoesNotExist":
            return cls(False)
        if operator in ("Gt", "Lt", "Gte", "Lte") and len(values) == 1:
            try:
                bound = int(values[0])
            except ValueError:
                return None
            if operator == "Gt":
                return cls(True, gte=bound + 1)
            if operator == "Lt":
                return cls(True, lte=bound - 1)
            return cls(True, gte=bound) if operator == "Gte" else cls(True, lte=bound)
        return None

    @property
    def negative(self) -> bool:
        """NotIn or DoesNotExist (Karpenter's Operator(): a complement with values, or an empty set)."""
        return (self.complement and bool(self.values)) or (not self.complement and not self.values)

    def _within(self, value: str, gte: int | None, lte: int | None) -> bool:
        if gte is None and lte is None:
            return True
        try:
            number = int(value)
        except ValueError:
            return False
        return (gte is None or number >= gte) and (lte is None or number <= lte)

    def intersection(self, other: Requirement) -> Requirement:
        gte = _max(self.gte, other.gte)
        lte = _min(self.lte, other.lte)
        if gte is not None and lte is not None and gte > lte:
            return Requirement(False)
        complement = self.complement and other.complement
        if self.complement and other.complement:
            values = self.values | other.values
        elif self.complement:
            values = other.values - self.values
        elif other.complement:
            values = self.values - other.values
        else:
            values = self.values & other.values
        values = frozenset(v for v in values if self._within(v, gte, lte))
        if not complement:
            gte = lte = None
        return Requirement(complement, values, gte, lte)

    def intersects(self, other: Requirement) -> bool:
        gte = _max(self.gte, other.gte)
        lte = _min(self.lte, other.lte)
        if gte is not None and lte is not None and gte > lte:
            return False
        if self.complement and other.complement:
            return True
        if self.complement:
            return any(v not in self.values and self._within(v, gte, lte) for v in other.values)
        if other.complement:
            return any(v not in other.values and self._within(v, gte, lte) for v in self.values)
        return any(v in other.values and self._within(v, gte, lte) for v in self.values)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


Requirements = dict[str, Requirement]
IMPOSSIBLE = Requirement(False)  # an unknown operator: nothing matches


def requirements(expressions: Iterable[Mapping[str, Any]], labels: Mapping[str, str] | None = None) -> Requirements:
    """Expressions and labels (``In`` of one value) ANDed per key, as ``Requirements.Add`` does."""
    out: Requirements = {}

    def add(key: str, req: Requirement) -> None:
        key = NORMALIZED.get(key, key)
        out[key] = out[key].intersection(req) if key in out else req

    for expr in expressions:
        values = [str(v) for v in expr.get("values") or []]
        req = Requirement.from_expression(str(expr.get("operator") or ""), values)
        add(str(expr.get("key") or ""), req or IMPOSSIBLE)
    for key, value in (labels or {}).items():
        add(str(key), Requirement(False, frozenset({str(value)})))
    return out


def compatible(pool: Requirements, pod: Requirements) -> bool:
    """Karpenter's ``Compatible(pod, AllowUndefinedWellKnownLabels)``."""
    for key, wanted in pod.items():
        if key in pool:
            have = pool[key]
            if not have.intersects(wanted) and not (wanted.negative and have.negative):
                return False
        elif not well_known(key) and not wanted.negative:
            return False  # "label does not have known values"
    return True


@dataclass(frozen=True)
class NodePool:
    """What deciding a launch needs of one ``karpenter.sh/v1`` NodePool."""

    name: str
    requirements: Requirements = dataclasses.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    used: Mapping[str, int] = dataclasses.field(default_factory=dict)
    ready: bool = True
    deleting: bool = False

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> NodePool:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        template = spec.get("template") or {}
        tspec = template.get("spec") or {}
        name = str(meta.get("name") or "")
        labels = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
        labels[NODEPOOL_LABEL] = name
        ready = not any(
            c.get("type") == "Ready" and c.get("status") == "False" for c in status.get("conditions") or []
        )
        return cls(
            name=name,
            requirements=requirements(tspec.get("requirements") or [], labels),
            taints=tuple(Taint.from_json(t) for t in tspec.get("taints") or []),
            limits=_resources(spec.get("limits")),
            used=_resources(status.get("resources")),
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def exhausted(self) -> bool:
        """The limits stop every launch: a limit of zero, or usage already past one."""
        return any(limit <= 0 or self.used.get(name, 0) > limit for name, limit in self.limits.items())

    @property
    def launches(self) -> bool:
        return self.ready and not self.deleting and not self.exhausted

    def allows(self, capacity_type: str) -> bool:
        have = self.requirements.get(CAPACITY_TYPE)
        return have is None or have.intersects(Requirement(False, frozenset({capacity_type})))

    def tolerated_by(self, tolerations: Sequence[Toleration]) -> bool:
        return all(t.effect not in FILTERING_EFFECTS or tolerated(t, tolerations) for t in self.taints)


def _resources(raw: Any) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        return {}
    try:
        return quantities.parse_resources(raw)
    except ValueError:
        return {}


def pod_terms(pod: PodView, extra: Sequence[Mapping[str, Any]] = ()) -> list[Requirements]:
    """The pod's requirements, one set per required ``nodeSelectorTerm`` (ORed), each with its
    nodeSelector and ``extra`` expressions ANDed in."""
    terms = [t.get("matchExpressions") or [] for t in pod.required_terms] or [[]]
    if pod.has_required_affinity and not pod.required_terms:
        return []  # an empty list of terms matches no node
    return [requirements([*term, *extra], pod.node_selector) for term in terms]


def on_demand_for(
    pod: PodView, pools: Iterable[NodePool], on_demand: Sequence[Sequence[Mapping[str, Any]]]
) -> str | None:
    """The name of a NodePool that can launch an on-demand node for ``pod`` once it carries
    the on-demand requirement (``on_demand``: its ORed lists of expressions, with
    ``karpenter.sh/capacity-type In [on-demand]`` added to each), or None."""
    want = [{"key": CAPACITY_TYPE, "operator": "In", "values": [ON_DEMAND]}]
    terms = [t for extra in (on_demand or [[]]) for t in pod_terms(pod, [*extra, *want])]
    for pool in sorted(pools, key=lambda p: p.name):
        if not pool.launches or not pool.tolerated_by(pod.tolerations):
            continue
        if any(compatible(pool.requirements, term) for term in terms):
            return pool.name
    return None


def any_on_demand(pools: Iterable[NodePool]) -> bool:
    """Some NodePool can launch on-demand capacity for some pod (the cluster-wide view)."""
    return any(p.launches and p.allows(ON_DEMAND) for p in pools)
