"""Fit: the part of kube-scheduler's filtering that spotguard relies on.

Written from the Kubernetes documentation, not from the scheduler's code:

- resources (NodeResourcesFit): for every resource the pod requests (its
  effective requests, :func:`spotguard.policy.quantities.pod_requests`), the
  requests of the pods already on the node plus the pod's must not exceed the
  node's allocatable; the node's ``pods`` allocatable bounds the pod count.
  https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/
- taints (TaintToleration): every taint with effect ``NoSchedule`` or
  ``NoExecute`` must be tolerated; ``PreferNoSchedule`` never filters.
  https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
- nodeSelector and required node affinity (NodeAffinity): every nodeSelector
  pair must be a node label; the ``nodeSelectorTerms`` are ORed, the
  expressions and fields inside one term are ANDed; an empty term, and an
  empty list of terms, match no node. Operators In, NotIn, Exists,
  DoesNotExist, Gt, Lt; ``matchFields`` supports ``metadata.name`` with In and
  NotIn.
  https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/
- unschedulable (cordoned) and not-Ready nodes (NodeUnschedulable, and the
  taints the node lifecycle controller adds): they take no pod unless the pod
  tolerates ``node.kubernetes.io/unschedulable:NoSchedule`` /
  ``node.kubernetes.io/not-ready:NoSchedule``.

Not modelled: pod (anti-)affinity, topology spread (``DoNotSchedule``), host
ports, volumes, scoring. A node that reports no allocatable at all is not
checked for resources (its capacity is unknown); a node that reports no
``pods`` allocatable is not checked for the pod count.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotguard.policy import quantities
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.tolerations import Taint, Toleration, tolerated
from spotguard.policy.views import NodeView, PodView

UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
NOT_READY_TAINT = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NODE_NAME_FIELD = "metadata.name"

Expression = Mapping[str, Any]
ExpressionFilter = Callable[[Expression], bool]


class Reason(enum.StrEnum):
    INSUFFICIENT_RESOURCE = "InsufficientResource"
    TOO_MANY_PODS = "TooManyPods"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    NODE_SELECTOR = "NodeSelectorMismatch"
    NODE_AFFINITY = "NodeAffinityMismatch"
    UNSCHEDULABLE = "Unschedulable"
    NOT_READY = "NotReady"


@dataclass(frozen=True)
class Failure:
    reason: Reason
    message: str


@dataclass(frozen=True)
class Fit:
    """Whether one pod fits one node, and every reason it does not."""

    node: str
    failures: tuple[Failure, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def reasons(self) -> frozenset[Reason]:
        return frozenset(f.reason for f in self.failures)

    def __str__(self) -> str:
        if self.ok:
            return f"fits {self.node}"
        return f"does not fit {self.node}: " + "; ".join(f.message for f in self.failures)


@dataclass(frozen=True)
class Usage:
    """What the pods on one node already take: summed requests and the pod count."""

    requests: Mapping[str, int] = field(default_factory=dict)
    pods: int = 0

    def plus(self, requests: Mapping[str, int], pods: int = 1) -> Usage:
        return Usage(quantities.add(dict(self.requests), requests), self.pods + pods)


EMPTY = Usage()


def occupies_node(pod: PodView) -> bool:
    """A pod bound to a node holds its resources until it has finished.

    Terminating pods still hold them (they are still running).
    """
    return bool(pod.node_name) and pod.phase not in ("Succeeded", "Failed")


def usage_by_node(pods: Iterable[PodView]) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for p in pods:
        if occupies_node(p):
            out[p.node_name] = out.get(p.node_name, EMPTY).plus(p.requests)
    return out


def _integer(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def match_requirement(expr: Expression, labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` entry against node labels."""
    key = str(expr.get("key", ""))
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, want = _integer(labels[key]), _integer(values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def match_field(expr: Expression, node: NodeView) -> bool:
    """One ``matchFields`` entry: only ``metadata.name`` with In or NotIn exists."""
    if expr.get("key") != NODE_NAME_FIELD:
        return False
    values = [str(v) for v in expr.get("values") or []]
    if expr.get("operator") == "In":
        return node.name in values
    if expr.get("operator") == "NotIn":
        return node.name not in values
    return False


def term_matches(
    term: Mapping[str, Any], node: NodeView, ignore: ExpressionFilter | None = None
) -> bool:
    """A nodeSelectorTerm: its expressions and fields ANDed; an empty term matches nothing.

    Expressions for which ``ignore`` is true are taken as satisfied (a term
    made only of ignored expressions matches every node).
    """
    exprs: Sequence[Expression] = term.get("matchExpressions") or []
    fields: Sequence[Expression] = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    kept = [e for e in exprs if ignore is None or not ignore(e)]
    return all(match_requirement(e, node.labels) for e in kept) and all(
        match_field(f, node) for f in fields
    )


def matches_required_affinity(
    pod: PodView, node: NodeView, ignore: ExpressionFilter | None = None
) -> bool:
    """The pod's required node affinity: any term matches (no affinity: every node)."""
    if not pod.has_required_affinity:
        return True
    return any(term_matches(t, node, ignore) for t in pod.required_terms)


def matches_node_selector(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def resource_failures(
    requests: Mapping[str, int], node: NodeView, used: Usage = EMPTY
) -> list[Failure]:
    out: list[Failure] = []
    allocatable = node.allocatable
    if "pods" in allocatable and used.pods + 1 > allocatable["pods"]:
        out.append(Failure(Reason.TOO_MANY_PODS, "Too many pods"))
    if not allocatable:
        return out
    for name in sorted(requests):
        want = requests[name]
        if name == "pods" or want <= 0:
            continue
        if used.requests.get(name, 0) + want > allocatable.get(name, 0):
            out.append(Failure(Reason.INSUFFICIENT_RESOURCE, f"Insufficient {name}"))
    return out


def effective_taints(node: NodeView) -> list[Taint]:
    """The node's taints plus the ones a cordon or a not-Ready condition implies."""
    taints = list(node.taints)
    keys = {t.key for t in taints}
    if node.unschedulable and UNSCHEDULABLE_TAINT.key not in keys:
        taints.append(UNSCHEDULABLE_TAINT)
    if not node.ready and NOT_READY_TAINT.key not in keys:
        taints.append(NOT_READY_TAINT)
    return taints


def taint_failures(node: NodeView, tolerations: Sequence[Toleration]) -> list[Failure]:
    out: list[Failure] = []
    for taint in effective_taints(node):
        if taint.effect not in FILTERING_EFFECTS or tolerated(taint, tolerations):
            continue
        if taint.key == UNSCHEDULABLE_TAINT.key:
            out.append(Failure(Reason.UNSCHEDULABLE, "node is unschedulable (cordoned)"))
        elif taint.key == NOT_READY_TAINT.key:
            out.append(Failure(Reason.NOT_READY, "node is not Ready"))
        else:
            shown = f"{taint.key}={taint.value}" if taint.value else taint.key
            out.append(
                Failure(Reason.UNTOLERATED_TAINT, f"untolerated taint {shown}:{taint.effect}")
            )
    return out


def check(
    pod: PodView,
    node: NodeView,
    used: Usage = EMPTY,
    *,
    extra_tolerations: Sequence[Toleration] = (),
    ignore_expression: ExpressionFilter | None = None,
) -> Fit:
    """Does ``pod`` fit ``node``, whose existing pods take ``used``?

    ``extra_tolerations`` are added to the pod's own (what an admission patch
    would add); required-affinity expressions for which ``ignore_expression``
    is true are left out (for example the on-demand requirement a replacement
    pod will not carry).
    """
    failures: list[Failure] = []
    failures += taint_failures(node, tuple(pod.tolerations) + tuple(extra_tolerations))
    if not matches_node_selector(pod.node_selector, node.labels):
        failures.append(Failure(Reason.NODE_SELECTOR, "node does not match the pod's nodeSelector"))
    if not matches_required_affinity(pod, node, ignore_expression):
        failures.append(
            Failure(Reason.NODE_AFFINITY, "node does not match the pod's required node affinity")
        )
    failures += resource_failures(pod.requests, node, used)
    return Fit(node.name, tuple(failures))


def check_all(
    pod: PodView,
    nodes: Iterable[NodeView],
    pods: Iterable[PodView],
    *,
    extra_tolerations: Sequence[Toleration] = (),
    ignore_expression: ExpressionFilter | None = None,
) -> list[Fit]:
    """``check`` against every node, with usage computed from ``pods``."""
    usage = usage_by_node(pods)
    return [
        check(
            pod,
            n,
            usage.get(n.name, EMPTY),
            extra_tolerations=extra_tolerations,
            ignore_expression=ignore_expression,
        )
        for n in nodes
    ]


# Taints that come and go with a node's state (cordon, readiness, a notice), not with its pool.
TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "spotguard.io/")


def within_reach(pod: PodView, nodes: Iterable[NodeView], config: Config) -> frozenset[Capacity]:
    """The capacities of the nodes the pod's own spec lets it run on.

    A node is in reach when it matches the pod's nodeSelector and required node
    affinity and its pool's ``NoSchedule``/``NoExecute`` taints are tolerated (a
    spot node's with the configured spot tolerations, which a spot slot adds).
    Readiness, cordons, notices and free room are left out: they change, a node
    pool's labels and taints do not. A pod pinned to a node pool whose nodes are
    all spot (``karpenter.sh/nodepool: batch-spot``) has only spot in reach.
    """
    found: set[Capacity] = set()
    for node in nodes:
        cap = config.node_capacity(node.labels)
        if cap in found:
            continue
        tolerations = tuple(pod.tolerations) + (tuple(config.spot_tolerations) if cap is Capacity.SPOT else ())
        if any(
            t.effect in FILTERING_EFFECTS
            and not t.key.startswith(TRANSIENT_TAINT_PREFIXES)
            and not tolerated(t, tolerations)
            for t in node.taints
        ):
            continue
        if matches_node_selector(pod.node_selector, node.labels) and matches_required_affinity(pod, node):
            found.add(cap)
    return frozenset(found)
