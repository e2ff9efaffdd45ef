"""The eviction guard's decision: may this pod be evicted now? (pure; no I/O)

A drainer that acts at a spot notice (aws-node-termination-handler without
cordon-only, Karpenter's interruption handling) evicts through the Eviction API
the moment the node is marked, often before spotguard has handled the notice.
The guard answers the ``pods/eviction`` admission review: it refuses (429, the
drainer retries) the eviction of a Ready pod of a managed Deployment or
StatefulSet on a spot node that is going away while the workload has fewer Ready
pods on nodes that stay than it wants. Off spot (an on-demand node an autoscaler
consolidates or scales down, a ``kubectl drain``) it guards the same count only
where spotguard's promise is at stake: the floor of a StatefulSet already short of
pods elsewhere, a Deployment whose surge for a notice still runs (at a reclaim,
the doomed pods still look Ready until the node controller marks their node, so a
PodDisruptionBudget lets a consolidation take an on-demand floor pod then), and a
Deployment on a node a node autoscaler drains (Karpenter's consolidation, the Cluster
Autoscaler's scale-down evict every pod of the node at once; Karpenter consolidates spot
nodes too, so a Deployment's pods on a spot node so drained are held the same way):
spotguard's reconcile surges its replacements first (:mod:`spotguard.policy.drains`);
for ``floor_hold`` seconds at most, or until the drain's notice ends. It allows everything else (a
person's ``kubectl drain`` of an on-demand node keeps its own pace).

Why "Ready pods on nodes that stay": evicting a pod of a node that is going away
never changes that count, so concurrent evictions (a drainer evicts a node's pods
in parallel, several webhook processes answer them) cannot race each other past
it, and the guard needs no write and no shared state.

It never wedges a drain: a node with spotguard's notice (its mark on the node, or
the workload's surge record naming it) is released ``release`` seconds before its
reclaim time (the drain still finishes inside the window), or ``rebalance_hold``
seconds after a rebalance recommendation; a node without one is protected for
``grace`` seconds after this process first saw its drain signals (the notice usually
reaches spotguard within a second or two), then released. A drain signal that comes
after a rebalance recommendation's hold (the interruption warning's drainer, which
often acts before spotguard has handled the warning) gets that grace too, and then
the warning's reclaim time once spotguard has written it.

The guard decides from the pod and its node first (:func:`at_node`): a pod that
serves nothing, or whose node is not going away, is let go without reading more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from spotguard.policy import drains, interruption, surges
from spotguard.policy.notices import NodeNotice, NoticeKind
from spotguard.policy.views import PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, Kind, Workload

# Taints that say "this node is being drained / going away", besides a cordon
# (spec.unschedulable): spotguard's own, Karpenter v1 and v1beta1, the
# aws-node-termination-handler's (TAINT_NODE), the cluster autoscaler's, and the
# one the node lifecycle controller adds to a cordoned node.
GOING_AWAY_TAINTS = frozenset({
    INTERRUPTION_TAINT,
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "ToBeDeletedByClusterAutoscaler",
    "node.kubernetes.io/unschedulable",
})
UNSCHEDULABLE = "spec.unschedulable"  # a cordon, as a drain signal
RETRY_SECONDS = 5  # kubectl drain (and aws-node-termination-handler) retry a 429 every 5 s


@dataclass(frozen=True)
class Timing:
    grace: float = 8.0  # a going-away spot node without spotguard's notice: protected this long
    release: float = 30.0  # a noticed node: everything may go this long before its reclaim time
    # a node with a rebalance recommendation only (no reclaim time yet; a drainer that drains
    # at rebalance recommendations): guarded this long after the notice at most
    rebalance_hold: float = 120.0
    # a node that is not spot, without a notice, drained (an autoscaler's consolidation or
    # scale-down, kubectl drain) while a StatefulSet short of pods elsewhere is at its floor or a
    # Deployment's surge runs, or a Deployment's pod on a node (spot too) a node autoscaler
    # drains: guarded this long after this process first saw the drain
    floor_hold: float = 300.0
    # the guard could not read the cluster (a 5xx, a 429, a timeout): the eviction is refused
    # with a short retry for this long after the pod's first such failure, then allowed
    error_hold: float = 20.0


@dataclass(frozen=True)
class NodeFacts:
    name: str
    spot: bool
    unschedulable: bool = False
    taint_keys: frozenset[str] = frozenset()
    notice: NodeNotice | None = None  # spotguard's ``spotguard.io/notice`` record

    @property
    def going_away(self) -> bool:
        return self.unschedulable or bool(self.taint_keys & GOING_AWAY_TAINTS)

    @property
    def autoscaler_drained(self) -> bool:
        """A node autoscaler removes the node (Karpenter's consolidation, the Cluster
        Autoscaler's scale-down; Karpenter's own interruption handling taints the same)."""
        return bool(self.taint_keys & drains.AUTOSCALER_DRAIN_TAINTS)

    @property
    def drain_signals(self) -> frozenset[str]:
        """What says the node is going away besides spotguard's own mark (a cordon, a
        drainer's or an autoscaler's taint). A sighting of the node is a sighting of these:
        one that appears later (a drainer acting on the interruption warning after a
        rebalance recommendation's taint) starts a sighting of its own."""
        keys = self.taint_keys & GOING_AWAY_TAINTS
        if self.notice is not None:
            keys -= {INTERRUPTION_TAINT}
        return keys | {UNSCHEDULABLE} if self.unschedulable else keys


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # a short machine-friendly reason (metrics, logs)
    message: str = ""  # for a denial: what the drainer's user reads
    retry_after: int = 0  # seconds (a denial only)


def wanted(workload: Workload, floor_on_demand: int, record: surges.SurgeRecord | None = None) -> int:
    """How many Ready pods on nodes that stay the workload wants before a doomed pod goes.

    A Deployment: the count before the notice (the surge record's Ready count when
    the surge began, or its pre-surge replicas; never more than its owner wants now),
    else ``spec.replicas``. A StatefulSet: its floor (quorum by default): its pods
    cannot be replaced before they are gone, so it keeps the quorum, no more.
    ``record`` is the workload's surge record where the caller has read it already.
    """
    if workload.kind is Kind.STATEFULSET:
        return max(0, min(floor_on_demand, workload.replicas))
    if record is None:
        record = surges.SurgeRecord.of(workload)
    if record is not None and not record.done:
        keep = record.ready or record.replicas
        return max(0, min(keep, interruption.owner_replicas(record, workload.replicas)))
    return max(0, workload.replicas)


def record_for(workload: Workload, copy_record: surges.SurgeRecord | None = None) -> surges.SurgeRecord | None:
    """The surge record the guard decides on: the one the Deployment's surge copy carries
    (``copy_record``, :data:`spotguard.policy.surgecopy.RECORD`, read by the caller) while
    that surge runs, else the Deployment's own ``spotguard.io/surge`` annotation.

    The copy's wins where both are there: nobody else writes the copy, while a ``kubectl
    replace`` or a GitOps replace of the Deployment drops its annotation (or puts back one
    from the manifest), and a copy's surge may keep its record on the copy only."""
    if workload.kind is Kind.DEPLOYMENT and copy_record is not None and not copy_record.done:
        return copy_record
    return surges.SurgeRecord.of(workload)


def guarded_without_notice(
    workload: Workload, record: surges.SurgeRecord | None, *, short: bool, autoscaler: bool = False
) -> str | None:
    """Why ``workload`` is guarded on a node without a notice that is not spot, or that a node
    autoscaler drains (a Deployment on a spot node; None: it is not). A StatefulSet that is
    ``short`` already (fewer Ready pods on nodes that stay and on this one than its
    replicas: pods lost to a reclaim, or on other nodes going away), whose missing pods
    come back in time; one with every pod serving is let go at once (it cannot
    be replaced before its pod is gone: holding the drain would only delay it). A Deployment
    while its surge runs (the count before the notice is the promise until its replacements
    are Ready). A Deployment on a node a node autoscaler drains (``autoscaler``: Karpenter's
    consolidation, the Cluster Autoscaler's scale-down): spotguard's reconcile surges it
    before the pods go (:mod:`spotguard.policy.drains`)."""
    if workload.kind is Kind.STATEFULSET:
        return "the StatefulSet is short of pods elsewhere (they come back first)" if short else None
    if record is not None and not record.done:
        return "the workload's surge for a spot notice is still running"
    if autoscaler:
        return "a node autoscaler drains it: spotguard surges the replacements first (within its reconcile period)"
    return None


def surge_cover(record: surges.SurgeRecord | None, node: str) -> tuple[float, bool, float] | None:
    """(reclaim time, a rebalance's node?, when the surge began) where the workload's running
    surge covers ``node``; None otherwise.

    The surge record is the notice as the workload carries it: the node's own mark may be
    missing (its taint write failed and waits for the notice's redelivery, tens of seconds
    later), and without it the node would get only the short grace of a node nobody told
    spotguard about, while the surge replicas are still starting."""
    if record is None or record.done or node not in record.nodes:
        return None
    until = record.deadline(node, 0.0)
    if until <= 0:
        return None
    rebalance = record.rebalance is not None and node in record.rebalance
    return until, rebalance, record.started


def ready_on_staying_nodes(pods: Iterable[PodView], nodes: Mapping[str, NodeFacts]) -> int:
    """Ready pods on nodes that exist and are not going away."""
    count = 0
    for p in pods:
        node = nodes.get(p.node_name)
        if p.active and p.ready and node is not None and not node.going_away:
            count += 1
    return count


def at_node(*, pod: PodView, node: NodeFacts | None) -> Decision | None:
    """The answer from the pod and its node alone, or None when it needs the workload.

    A pod that serves nothing, or whose node stays, may always go: the guard never holds
    such a pod, however slow the rest of the cluster is to read."""
    if not pod.active or not pod.ready:
        return Decision(True, "not-serving")
    if node is None or not node.going_away:
        return Decision(True, "node-stays")
    return None


def without_workload(*, node: NodeFacts) -> Decision | None:
    """The answer when the workload cannot be read in time (the pod's node is going away):
    an on-demand node without spotguard's notice that no node autoscaler drains is never
    guarded (only the workload's surge record could say spotguard was told about it, and a
    node spotguard was told about carries its notice unless that write failed); anything
    else is unknown (None). A node an autoscaler drains guards a Deployment's pods before
    spotguard's drain notice is written (Karpenter's consolidation evicts them all at
    once): let go here when a read failed, such a pod was lost (the chaos case
    consolidation-after-reclaim under 20 % 500s: worker 8 -> 7)."""
    if node.notice is None and not node.spot and not node.autoscaler_drained:
        return Decision(True, "not-spot")
    return None


@dataclass(frozen=True)
class _Notice:
    until: float  # the reclaim time (or a rebalance's end)
    rebalance: bool
    time: float  # when the notice came (or the surge began)
    source: str
    drain: bool = False  # a node autoscaler's drain (spotguard.policy.drains), no reclaim


def _notices(node: NodeFacts, record: surges.SurgeRecord | None) -> list[_Notice]:
    out = []
    if node.notice is not None:
        n = node.notice
        out.append(
            _Notice(
                n.until,
                n.kind is NoticeKind.REBALANCE,
                n.time,
                f"spotguard notice {n.event_id}",
                n.kind is NoticeKind.DRAIN,
            )
        )
    if node.notice is None or node.notice.kind is NoticeKind.REBALANCE:
        covered = surge_cover(record, node.name)
        if covered is not None:
            until, rebalance, started = covered
            out.append(_Notice(until, rebalance, started, "the workload's surge covers it"))
    # a reclaim time wins over a rebalance recommendation's end (the node's mark may still
    # say rebalance where the interruption's mark write failed and the surge record has it)
    reclaims = [n for n in out if not n.rebalance]
    return reclaims or out


def decide(
    *,
    pod: PodView,
    workload: Workload | None,
    floor_on_demand: int,
    pods: Sequence[PodView],
    nodes: Mapping[str, NodeFacts],
    now: float,
    first_seen: float,
    timing: Timing = Timing(),
    node_read_at: float | None = None,
    copy_record: surges.SurgeRecord | None = None,
) -> Decision:
    """May ``pod`` be evicted now?

    ``workload`` is None when it is not one spotguard manages (no controller, a
    DaemonSet or Job, an excluded namespace, ``spotguard.io/enabled: "false"`` on the
    pod, its workload or namespace); a surge copy's pod's is the Deployment it surges
    (:func:`spotguard.policy.interruption.copy_workload_key`). ``pods`` are the workload's
    own pods (its copy's among them); ``nodes``
    every node by name. ``now`` is the deciding process's clock (epoch seconds);
    ``first_seen`` when this process first saw the pod's node with its current drain
    signals (:attr:`NodeFacts.drain_signals`), without seeing it stop going away since
    (``now`` if it is the first time). ``node_read_at``: when the pod's node was read (its
    facts are as of then; ``now`` if not given). ``copy_record``: the surge record a
    Deployment's surge copy carries, where it has one (:func:`record_for`).

    A going-away spot node without spotguard's notice is let go once the grace has run out
    *as of the node's read*: a review held seconds by slow reads decides with a node read
    at its start, and the notice may have been written meanwhile. Under 20 % hung requests
    (chaos aborted-drain) a review began on spot-0 at the drain's start, spotguard marked the
    node at +8.5 s, and at +12.6 s the review, its other reads held and retried, answered
    "no-notice" (the grace ran out at about +8 s) from its read of the node at its start.
    """
    node = nodes.get(pod.node_name)
    early = at_node(pod=pod, node=node)
    if early is not None:
        return early
    assert node is not None
    if workload is None:
        return Decision(True, "not-managed")
    record = record_for(workload, copy_record)  # read once: the cover and the count to keep
    noticed = _notices(node, record)
    # A spot node a node autoscaler drains without spotguard's notice: a consolidation (Karpenter
    # deletes an under-used spot node too) or a reclaim whose warning is on its way. A
    # Deployment's pods there are held as on an on-demand node (its drain surge comes within the
    # reconcile period, the reclaim's notice within seconds); a StatefulSet's for the grace.
    drained_spot = node.spot and node.autoscaler_drained and workload.kind is Kind.DEPLOYMENT
    if not noticed and (not node.spot or drained_spot):
        here = sum(1 for p in pods if p.active and p.ready and p.node_name == node.name)
        short = ready_on_staying_nodes(pods, nodes) + here < workload.replicas
        guarded = guarded_without_notice(workload, record, short=short, autoscaler=node.autoscaler_drained)
        if guarded is None:
            return Decision(True, "not-spot")
        release_at = first_seen + timing.floor_hold
        if now >= release_at:
            return Decision(True, "floor-hold-over")
        why = f"node {node.name} is being drained and {guarded}"
    elif noticed:
        n = noticed[0]
        release_at = n.until - timing.release
        if not n.rebalance and now >= release_at:
            return Decision(True, "reclaim-near")
        why = (
            f"a node autoscaler drains node {node.name}; its replacements are awaited until "
            f"{_clock(n.until)} ({n.source})"
            if n.drain
            else f"node {node.name} is reclaimed at {_clock(n.until)} ({n.source})"
        )
        if n.rebalance:
            hold_end = min(release_at, n.time + timing.rebalance_hold)
            if now >= hold_end:
                # The recommendation's hold is over; a drain signal seen since (the warning's
                # drainer, ahead of spotguard's handling of the warning) gets the grace.
                if not node.drain_signals:
                    return Decision(True, "rebalance-over")
                hold_end = max(hold_end, first_seen + timing.grace)
                if now >= hold_end:
                    return Decision(True, "rebalance-over")
                why = (
                    f"node {node.name} had a rebalance recommendation ({n.source}) and is being drained now: "
                    "the interruption warning may be on its way to spotguard"
                )
            else:
                why = f"node {node.name} had a rebalance recommendation ({n.source})"
            release_at = hold_end
    else:
        release_at = first_seen + timing.grace
        known_at = now if node_read_at is None else min(now, node_read_at)  # no notice, as of then
        if known_at >= release_at:
            return Decision(True, "no-notice")
        why = f"spot node {node.name} is going away and spotguard's notice for it may be on its way"
    want = wanted(workload, floor_on_demand, record)
    have = ready_on_staying_nodes(pods, nodes)
    retry = max(1, min(RETRY_SECONDS, math.ceil(release_at - now)))
    if have >= want:
        if handed_over(workload, record, node, noticed):
            message = (
                f"spotguard: {workload.kind} {workload.namespace}/{workload.name} has its replacements Ready on "
                f"nodes that stay; a node autoscaler drains node {node.name} and spotguard's scale back removes "
                f"this pod itself (evicted, its ReplicaSet would create one more pod for the autoscaler to launch "
                f"a node for). Retry after {retry}s (allowed by {_clock(release_at)} at the latest)."
            )
            return Decision(False, "scale-back-pending", message, retry)
        return Decision(True, "replaced")
    message = (
        f"spotguard: {workload.kind} {workload.namespace}/{workload.name} has {have} Ready pods on nodes "
        f"that stay and keeps {want} serving; {why}; its replacements are starting. "
        f"Retry after {retry}s (allowed by {_clock(release_at)} at the latest)."
    )
    return Decision(False, "protected", message, retry)


def handed_over(
    workload: Workload, record: surges.SurgeRecord | None, node: NodeFacts, noticed: Sequence[_Notice]
) -> bool:
    """A Deployment's pod on a node a node autoscaler only drains, whose running surge covers the
    node: once its replacements are Ready, spotguard's scale back removes the drained pods
    (ranked first; :func:`spotguard.policy.interruption.finish`), so the guard keeps refusing
    their evictions until then (at most until the drain's release)."""
    return (
        workload.kind is Kind.DEPLOYMENT
        and record is not None
        and not record.done
        and not record.copy
        and node.name in record.nodes
        and bool(noticed)
        and node.notice is not None
        and interruption.drained_only(record, {node.name: node.notice}, node.name)
    )


def node_replaced(
    node: str,
    *,
    workloads: Iterable[tuple[Workload, int]],
    pods: Iterable[PodView],
    nodes: Mapping[str, NodeFacts],
    owner_of: Callable[[PodView], str | None],
) -> bool:
    """True when ``node`` may go now: every managed workload (with its on-demand floor) that
    has a serving pod on it has what :func:`wanted` asks Ready on nodes that stay (its surge
    is Ready). What lets an ASG lifecycle hook be completed. ``owner_of`` gives a pod's
    workload key (``Deployment/ns/name``)."""
    by_key: dict[str, list[PodView]] = {}
    for p in pods:
        key = owner_of(p)
        if key is not None:
            by_key.setdefault(key, []).append(p)
    for workload, floor_on_demand in workloads:
        own = by_key.get(workload.key, [])
        if not any(p.node_name == node and p.active and p.ready for p in own):
            continue
        if ready_on_staying_nodes(own, nodes) < wanted(workload, floor_on_demand):
            return False
    return True


ERROR_RETRY_SECONDS = 1


def errors_began(previous: tuple[float, float] | None, now: float, timing: Timing = Timing()) -> float:
    """When a pod's reviews began failing in a row, given this failure at ``now`` and the
    first and last of the failures before it since its last answered review (None: none).

    Failures in a row are those of one drain's retries: a failure more than ``error_hold``
    after the last one (no review of the pod came between) begins a new run. Counted from
    a failure of a drain aborted a minute before, a new drain's first failed review was let
    go at once (chaos aborted-drain under timeouts: a review of api's pod on spot-0 failed
    during the aborted drain, none came for 95 s, and the new drain's first review, failing
    too, answered failed-open: api 3 -> 2)."""
    if previous is None:
        return now
    first, last = previous
    return now if now - last > timing.error_hold else first


def on_error(*, error: str, first_error: float, now: float, timing: Timing = Timing()) -> Decision:
    """The answer when the guard could not read what it needs (the API server answered
    5xx or 429, or did not answer in time).

    Allowing would hand the drainer the very pod the guard exists for (a 20 % rate of
    500s makes a five-read review fail two times in three); refusing for good would wedge
    every drain while the API server is unwell. So a transient failure refuses with a
    one-second retry (the drainer's next attempt usually reads fine) for ``error_hold``
    seconds after this pod's first failure in a row, and allows after that.
    """
    if now - first_error >= timing.error_hold:
        return Decision(True, "failed-open")
    message = (
        f"spotguard could not check this eviction ({error}); the pod may be one whose replacement "
        f"is still starting. Retry after {ERROR_RETRY_SECONDS}s "
        f"(allowed by {_clock(first_error + timing.error_hold)} at the latest if this persists)."
    )
    return Decision(False, "api-error", message, ERROR_RETRY_SECONDS)


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%SZ")
