"""A node autoscaler's drain as a notice: replace before the autoscaler evicts (pure).

Karpenter's consolidation and the Cluster Autoscaler's scale-down remove a node that
is not spot-reclaimed by evicting every pod on it at once through the Eviction API,
then deleting it (Karpenter: taint ``karpenter.sh/disrupted:NoSchedule``, evict every
pod but a do-not-disrupt one, terminate; ``pkg/controllers/node/termination``. The
Cluster Autoscaler: taint ``ToBeDeletedByClusterAutoscaler``, evict, retrying for
``--max-pod-eviction-time``, 2 minutes by default). Only a PodDisruptionBudget slows
that: a Deployment without one serves fewer replicas until its ReplicaSet's new pods
are Ready elsewhere, and one whose replicas all sit on the node serves none. After a
reclaim that is the common case: the surge's replacements wait on on-demand nodes
launched for them, and once the owner's count is back there the autoscaler packs them
into the room the fixed nodes have again (chaos ``consolidation-after-reclaim``).

spotguard treats such a drain as a notice with no reclaim time of its own: the node's
managed Deployments are surged as for a spot interruption (new replicas first; the
eviction guard refuses the drain's evictions of their Ready pods until the
replacements are Ready, ``spotguard.policy.evictions``), the node is marked with a
``drain`` notice that ends ``DRAIN_WINDOW`` seconds later at the latest, and the surge
ends as any other once the drained pods are gone (or the window is over: a drain the
autoscaler gave up leaves the node, and the node's mark and taint are removed; one still
drained keeps its mark, so a drain is surged once).

Spot nodes count too: Karpenter's consolidation deletes an under-used spot node as
it does an on-demand one (after a return to spot, the spot nodes launched for the
moves are packed together; the demo lost 2 of api's 3 and thumbnails' 4 replicas that
way for 32 s when spot nodes were left out). A spot node so tainted may instead be one
being reclaimed whose warning is on its way (Karpenter's own interruption handling
taints it at the warning): the warning, when it comes, replaces the drain's mark with
its sooner reclaim time (:func:`spotguard.policy.interruption.mark_stands`) and adds no
second surge for the node (its pods are in the record already). A plain cordon
(``kubectl cordon``/``drain``) is left out: a person's drain keeps its own pace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from spotguard.policy import floors
from spotguard.policy.config import Config
from spotguard.policy.notices import NodeNotice, Notice, NoticeKind
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import Kind, Workload

# The taints of a node autoscaler removing the node: Karpenter v1 and v1beta1, the
# Cluster Autoscaler (its soft DeletionCandidateOfClusterAutoscaler is no drain).
AUTOSCALER_DRAIN_TAINTS = frozenset({
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "ToBeDeletedByClusterAutoscaler",
})
# How long a drain's surge and the guard's hold last at most: a drain whose replacements
# cannot be Ready in this time (no capacity for them) goes ahead without them.
DRAIN_WINDOW = 300.0
EVENT_PREFIX = "drain/"


def autoscaler_drained(node: NodeView) -> bool:
    """Whether a node autoscaler is removing ``node`` (one of its drain taints)."""
    return any(t.key in AUTOSCALER_DRAIN_TAINTS for t in node.taints)


def instance_of(node: NodeView) -> str:
    """The id a drain notice names the node by: its EC2 instance, its providerID's last
    part, or its name (:func:`resolved` maps the last to the node)."""
    return node.instance_id or node.provider_id.rsplit("/", 1)[-1] or node.name


def notices(
    *,
    nodes: Sequence[NodeView],
    pods: Iterable[PodView],
    workloads: Iterable[Workload],
    marks: Mapping[str, NodeNotice],
    config: Config,
    now: float,
    workload_key_of: Callable[[PodView], str | None],
    namespace_annotations: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Notice]:
    """A ``drain`` notice for each node a node autoscaler drains (spot or on-demand) that
    carries no notice of spotguard's that still stands, and holds a Ready pod of a
    Deployment spotguard manages. ``workload_key_of`` maps a pod to its workload's key (or
    None)."""
    candidates = {n.name: n for n in nodes if autoscaler_drained(n) and not _standing(marks.get(n.name), now)}
    if not candidates:
        return []
    managed = {
        w.key
        for w in workloads
        if w.kind is Kind.DEPLOYMENT
        and floors.floor_for(w, config, (namespace_annotations or {}).get(w.namespace)).enabled
    }
    holding: set[str] = set()
    for p in pods:
        if p.node_name in candidates and p.active and p.ready and workload_key_of(p) in managed:
            holding.add(p.node_name)
    when = datetime.fromtimestamp(now, UTC)
    until = datetime.fromtimestamp(now + DRAIN_WINDOW, UTC)
    return [
        Notice(
            event_id=f"{EVENT_PREFIX}{name}/{int(now)}",
            kind=NoticeKind.DRAIN,
            instance_id=instance_of(candidates[name]),
            time=when,
            until=until,
        )
        for name in sorted(holding)
    ]


def resolved(drains: Iterable[Notice], nodes: Iterable[NodeView]) -> dict[str, str]:
    """instance id -> node for the drain notices that name a node by its name (no
    providerID): what the plan's ``resolved`` takes."""
    ids = {n.instance_id for n in drains}
    return {instance_of(node): node.name for node in nodes if instance_of(node) in ids}


def _standing(mark: NodeNotice | None, now: float) -> bool:
    """A notice of spotguard's stands on the node: one not over yet, or a drain's, however old
    (one surge per drain: a drain that outlasts its window, a pod the autoscaler waits for,
    is not surged again)."""
    return mark is not None and (mark.until > now or mark.kind is NoticeKind.DRAIN)


def mark_kept(mark: NodeNotice, node: NodeView) -> bool:
    """A drain's mark stays while the autoscaler still drains the node (:func:`_standing`);
    once it gave the node up, the node is untainted as any survivor."""
    return mark.kind is NoticeKind.DRAIN and autoscaler_drained(node)
