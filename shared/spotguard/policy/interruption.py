"""The interruption plan: what a batch of EC2 notices asks of the cluster.

Pure: given the notices, the nodes, pods, workloads, budgets, autoscalers and
the surges already recorded on the workloads, :func:`plan` says

- which notices are foreign (no node of this cluster) or ignored;
- the taints to add, one per doomed node (``spotguard.io/interruption=<event
  id>:NoSchedule``), none where one is already present;
- per Deployment, one surge entry: the replicas to add (its active pods on the
  newly doomed nodes), the record to write on the workload
  (``spotguard.io/surge``), the temporary budget to create and the autoscaler
  minimum to raise;
- StatefulSets whose quorum (their floor) is at risk.

A burst of notices gives one entry per node and one per workload. Replaying a
notice whose nodes are already in a workload's record adds nothing: the plan
only completes what is missing (budget, autoscaler), so a handling cut off
half-way is finished by the next delivery.

:func:`finish` says which surges are over (no pod Ready on a doomed node that
exists before its deadline, the replacements Ready) and how to scale each one
back: to the count the owner wants now (:func:`owner_replicas`).
:func:`evictions` says which doomed pods spotguard may evict itself (create
before evict). Every notice with an event id not in a record gets its
protection; each node of a record has its deadline (``until``: the reclaim
time, or the end of a rebalance's surge).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotguard.policy import floors, surgelife
from spotguard.policy import notices as notices_mod
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config, RebalanceAction
from spotguard.policy.notices import NodeNotice, Notice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import (
    INTERRUPTION_TAINT,
    Kind,
    Workload,
    surge_copy_name,
    surge_deployment,
)

# Instance states after which the pods of the instance are lost.
DOOMED_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
# A surge whose doomed pods never go away (a rebalance recommendation with no
# interruption after it) ends after this long; an interruption ends in two minutes.
SURGE_MAX_SECONDS = 900.0
BUDGET_PREFIX = "spotguard-surge-"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "spotguard"
POD_TEMPLATE_HASH = "pod-template-hash"


class Verdict(enum.StrEnum):
    DOOMED = "doomed"  # taint the node and surge its workloads
    TAINT = "taint"  # taint only (rebalance recommendation, action taint)
    FOREIGN = "foreign"  # no node of this cluster runs the instance
    IGNORED = "ignored"  # ours, but nothing to do (state running, rebalance ignore)


def owner_replicas(record: SurgeRecord, current: int) -> int:
    """The count the workload's owner wants now, at the end of a surge.

    Unchanged since spotguard wrote it: the count before the surge. Lowered by
    someone else (a GitOps revert, a person scaling down, a replace): theirs, as it
    is. Raised by someone else (a person or an autoscaler adding replicas): the
    count before the surge plus what they added.
    """
    return floors.owner_count(record.replicas, record.last_written, current)


def _owner_count(record: SurgeRecord, current: int, hpa: Autoscaler | None) -> int:
    """:func:`owner_replicas`, where a rise up to the autoscaler minimum spotguard set (and
    still holds) is that minimum at work, not a change of the owner's: the count before the
    surge stays. (A record rebased at the owner's lower count after a replace, with the
    minimum still raised: the autoscaler brings the count back up to it, and that must not
    become the count to scale back to.)"""
    if (
        hpa is not None
        and hpa.name == record.hpa
        and record.min_is_ours(hpa)
        and record.last_written < current <= hpa.min_replicas
    ):
        return record.replicas
    return owner_replicas(record, current)


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: its selector (raw LabelSelector) and whether spotguard made it."""

    namespace: str
    name: str
    selector: Mapping[str, Any] | None
    ours: bool = False

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Budget:
        meta = raw.get("metadata") or {}
        labels = meta.get("labels") or {}
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            selector=(raw.get("spec") or {}).get("selector"),
            ours=labels.get(MANAGED_BY_LABEL) == MANAGED_BY and str(meta.get("name", "")).startswith(BUDGET_PREFIX),
        )


# On a HorizontalPodAutoscaler, written in the same patch as the limits spotguard raises:
# the values it set (a user's later change never matches them).
HPA_SET_MIN = "spotguard.io/surge-min-replicas"
HPA_SET_MAX = "spotguard.io/surge-max-replicas"
# Written by a surge's end in the same patch that puts the limits back: which surge (its
# record's start, :func:`restore_key`). A surge's end is several writes (the limits, the
# budget, the scale back and the record); a handling of the same surge that reads between
# them (a notice retried after a failed write) must not raise the limits again, as if the
# user had lowered them: the end that scales back next finds nothing of its own to restore,
# and the raised minimum holds the surged count for good.
HPA_RESTORED = "spotguard.io/surge-restored"


def restore_key(record: SurgeRecord) -> str:
    """What :data:`HPA_RESTORED` says for ``record``'s surge."""
    return f"{record.started:.3f}"


@dataclass(frozen=True)
class Autoscaler:
    namespace: str
    name: str
    target_kind: str
    target_name: str
    min_replicas: int = 1
    max_replicas: int = 1
    resource_version: str = ""
    spotguard_min: int | None = None  # HPA_SET_MIN
    spotguard_max: int | None = None  # HPA_SET_MAX
    restored: str = ""  # HPA_RESTORED: the surge whose end put the limits back

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Autoscaler:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        mn = spec.get("minReplicas")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            target_kind=str(ref.get("kind", "")),
            target_name=str(ref.get("name", "")),
            min_replicas=1 if mn is None else int(mn),
            max_replicas=int(spec.get("maxReplicas") or 1),
            resource_version=str(meta.get("resourceVersion") or ""),
            spotguard_min=_annotation_int(meta, HPA_SET_MIN),
            spotguard_max=_annotation_int(meta, HPA_SET_MAX),
            restored=str((meta.get("annotations") or {}).get(HPA_RESTORED) or ""),
        )


def _annotation_int(meta: Mapping[str, Any], key: str) -> int | None:
    text = str((meta.get("annotations") or {}).get(key) or "")
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class NoticeResult:
    notice: Notice
    node: str  # "" where foreign
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class TaintStep:
    node: str
    event_id: str
    kind: NoticeKind
    notice: NodeNotice | None = None  # recorded on the node beside the taint

    def taint_json(self) -> dict[str, str]:
        return {"key": INTERRUPTION_TAINT, "value": self.event_id, "effect": "NoSchedule"}


@dataclass(frozen=True)
class BudgetStep:
    name: str
    min_available: int


@dataclass(frozen=True)
class AutoscalerStep:
    name: str
    min_replicas: int
    max_replicas: int  # unchanged where it was already large enough
    # the surge's restore_key: a raise stops where that surge's end began (not part of the step's value)
    surge: str = field(default="", compare=False)


@dataclass(frozen=True)
class SurgeStep:
    """One workload's surge: everything to write on it, once."""

    workload: Workload
    record: SurgeRecord
    replicas: int  # spec.replicas to have
    added: int  # replicas added by this plan (0: the record is already in place)
    new_nodes: tuple[str, ...]
    new_events: tuple[str, ...]
    doomed_pods: int  # active pods of the workload on all nodes of the record
    ready: int  # its Ready pods now
    budget: BudgetStep | None = None  # create this temporary budget
    autoscaler: AutoscalerStep | None = None  # raise the autoscaler to this

    changed: bool = False  # the record changed (new event ids, a new deadline)

    @property
    def write_workload(self) -> bool:
        return self.added > 0 or self.changed


@dataclass(frozen=True)
class QuorumWarning:
    workload: Workload
    doomed: int
    floor: int
    replicas: int
    nodes: tuple[str, ...]

    @property
    def message(self) -> str:
        return (
            f"{self.doomed} of {self.replicas} replicas run on nodes being reclaimed "
            f"({', '.join(self.nodes)}); {self.replicas - self.doomed} stay, below the "
            f"quorum floor of {self.floor}"
        )


@dataclass(frozen=True)
class Plan:
    notices: tuple[NoticeResult, ...]
    taints: tuple[TaintStep, ...]
    surges: tuple[SurgeStep, ...]
    warnings: tuple[QuorumWarning, ...]
    doomed_nodes: frozenset[str]
    # node -> event ids of the notices about it (to attribute failed writes)
    node_events: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()  # workloads left alone, with why

    @property
    def foreign(self) -> tuple[Notice, ...]:
        return tuple(r.notice for r in self.notices if r.verdict is Verdict.FOREIGN)


# --- label selectors ----------------------------------------------------------


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector against labels: null matches nothing, {} everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key = str(expr.get("key", ""))
        op = str(expr.get("operator", ""))
        values = set(expr.get("values") or ())
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


# --- who owns a pod -------------------------------------------------------------


def workload_key_of(pod: PodView, replicaset_owners: Mapping[tuple[str, str], str] | None = None) -> str | None:
    """``Deployment/ns/name`` or ``StatefulSet/ns/name`` for a pod, or None."""
    owner = pod.owner
    if owner is None:
        return None
    if owner.kind == "StatefulSet":
        return f"{Kind.STATEFULSET}/{pod.namespace}/{owner.name}"
    if owner.kind != "ReplicaSet":
        return None
    deploy = (replicaset_owners or {}).get((pod.namespace, owner.name))
    if deploy is None:
        suffix = pod.labels.get(POD_TEMPLATE_HASH)
        if not suffix or not owner.name.endswith("-" + suffix):
            return None
        deploy = owner.name[: -len(suffix) - 1]
    return f"{Kind.DEPLOYMENT}/{pod.namespace}/{deploy}"


def copy_workload_key(pod: PodView) -> str | None:
    """``Deployment/ns/name`` for a pod of a surge copy (its controller is the copy its label
    names, ``spotguard.policy.surgecopy``), else None. These pods are the Deployment's
    replicas where serving is counted, though no ReplicaSet of the Deployment owns them."""
    name = surge_deployment(pod.labels, pod.annotations)
    owner = pod.owner
    if not name or owner is None or owner.kind != "ReplicaSet" or owner.name != surge_copy_name(name):
        return None
    return f"{Kind.DEPLOYMENT}/{pod.namespace}/{name}"


# --- matching notices to nodes ----------------------------------------------------


def match_nodes(
    notices: Iterable[Notice],
    nodes: Iterable[NodeView],
    resolved: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """instance id -> node name: by providerID, then by ``resolved`` (e.g. EC2 private DNS)."""
    by_instance: dict[str, str] = {}
    for node in nodes:
        if node.instance_id:
            by_instance[node.instance_id] = node.name
        elif node.provider_id:
            by_instance[node.provider_id.rsplit("/", 1)[-1]] = node.name
    out: dict[str, str] = {}
    for n in notices:
        name = by_instance.get(n.instance_id) or (resolved or {}).get(n.instance_id)
        if name:
            out[n.instance_id] = name
    return out


ADVANCE_REASONS = {
    NoticeKind.LIFECYCLE: "ASG lifecycle hook (instance terminating)",
    NoticeKind.SCHEDULED: "AWS Health scheduled change",
    NoticeKind.DRAIN: "a node autoscaler drains the node (consolidation or scale-down)",
}


def verdict_of(notice: Notice, config: Config, now: float) -> tuple[Verdict, str]:
    """What a notice asks for now, and why."""
    if notice.kind is NoticeKind.INTERRUPTION:
        if now > deadline(notice, config, now) + STALE_SECONDS:
            return Verdict.IGNORED, "spot interruption warning past its reclaim time: the node outlived it"
        return Verdict.DOOMED, f"spot interruption warning ({notice.action or 'terminate'})"
    if notice.kind in notices_mod.ADVANCE_KINDS:
        if now > deadline(notice, config, now) + STALE_SECONDS:
            return Verdict.IGNORED, f"{notice.kind} notice past its reclaim time: the node outlived it"
        return Verdict.DOOMED, ADVANCE_REASONS[notice.kind]
    if notice.kind is NoticeKind.REBALANCE:
        action = config.rebalance_action
        if action is RebalanceAction.SURGE:
            return Verdict.DOOMED, "rebalance recommendation (rebalance_action=surge)"
        if action is RebalanceAction.TAINT:
            return Verdict.TAINT, "rebalance recommendation (rebalance_action=taint)"
        return Verdict.IGNORED, "rebalance recommendation (rebalance_action=ignore)"
    if notice.state in DOOMED_STATES:
        return Verdict.DOOMED, f"instance state {notice.state}"
    return Verdict.IGNORED, f"instance state {notice.state or 'unknown'}: nothing to do"


# A notice whose time is this far from our clock is a replay of a recorded event (or a
# clock gone wrong): its deadlines count from now instead.
CLOCK_TRUST_SECONDS = 3600.0
# A notice this long past its deadline is stale: the node it names outlived it.
STALE_SECONDS = 60.0


def notice_time(notice: Notice, now: float) -> float:
    t = notice.time.timestamp()
    return t if abs(now - t) <= CLOCK_TRUST_SECONDS else now


def deadline(notice: Notice, config: Config, now: float) -> float:
    """Until when a notice dooms its node: the reclaim time, or the end of a rebalance's surge."""
    t = notice_time(notice, now)
    if notice.until is not None:
        # The notice says when (a lifecycle hook's timeout, a scheduled change's start); a
        # replayed notice's clock is moved to now with its time.
        return t + max(0.0, notice.until.timestamp() - notice.time.timestamp())
    if notice.kind is NoticeKind.INTERRUPTION:
        return t + notices_mod.INTERRUPTION_WINDOW
    if notice.kind is NoticeKind.REBALANCE:
        return t + config.rebalance_surge_seconds
    # shutting-down, stopping, terminated: going now, but the API may show its pods for a
    # while; a surge still ends as soon as they are gone.
    return t + notices_mod.INTERRUPTION_WINDOW


def node_notice(notice: Notice, config: Config, now: float) -> NodeNotice:
    return NodeNotice(
        event_id=notice.event_id,
        kind=notice.kind,
        time=notice_time(notice, now),
        until=deadline(notice, config, now),
        state=notice.state,
        action=notice.action,
        lifecycle=notice.lifecycle,
    )


def mark_stands(old: NodeNotice, new: NodeNotice, now: float) -> bool:
    """True where the notice recorded on a node stands against a new one for it (the node's
    mark is not written again).

    The same notice stands. One that is over does not (a node that survived it). A reclaim
    (interruption, state change) replaces a rebalance recommendation's mark whatever their
    deadlines: the rebalance's end is no reclaim time, and a mark left saying rebalance lets
    the eviction guard release the node, and a surge end, at the rebalance's end while the
    reclaim is still to come (chaos drainer-after-rebalance-surge under timeouts: cart lost a
    replica). A rebalance recommendation never replaces a reclaim's mark (reordered
    messages). Otherwise the sooner deadline stands.
    """
    if old.event_id == new.event_id:
        return True
    if old.until <= now:
        return False
    old_reclaim = old.kind is not NoticeKind.REBALANCE
    new_reclaim = new.kind is not NoticeKind.REBALANCE
    if old_reclaim != new_reclaim:
        return old_reclaim
    return old.until <= new.until


def node_deadline(
    record: SurgeRecord, node: str, default: float, marks: Mapping[str, NodeNotice] | None = None
) -> float:
    """Until when a surge's node is doomed: the record's deadline for it, or the reclaim time
    its own mark names where that is later. The record keeps a rebalance recommendation's end
    for a node while the interruption that followed is still being written to it (the
    workload's write failed and is retried): the node's mark, written first, already says
    when it goes."""
    t = record.deadline(node, default)
    mark = marks.get(node) if marks else None
    if mark is not None and mark.kind is not NoticeKind.REBALANCE and mark.until > t:
        return mark.until
    return t


def node_deadlines(
    record: SurgeRecord, marks: Mapping[str, NodeNotice] | None = None, max_seconds: float = SURGE_MAX_SECONDS
) -> tuple[dict[str, float], float]:
    """Each of a surge's nodes' deadline (:func:`node_deadline`), and the last of them (the
    record's default, ``max_seconds`` after it started, where it names no node)."""
    default_until = record.started + max_seconds
    deadlines = {n: node_deadline(record, n, default_until, marks) for n in record.nodes}
    return deadlines, max(deadlines.values(), default=default_until)


def rebalance_survivors(
    record: SurgeRecord,
    alive: Collection[str],
    now: float,
    marks: Mapping[str, NodeNotice] | None,
    deadlines: Mapping[str, float],
) -> set[str]:
    """A surge's nodes that only had a rebalance recommendation, still exist, are past the
    rebalance's end and have no reclaim marked since (``marks``: the nodes' notices, with the
    reclaims the caller still retries): they live on, and their pods serve on a node that stays.

    A copy's surge counts them so (its own pods never count as the Deployment's): without them
    the copy waited for replacements of pods that never die, 300 s past the rebalance's end.
    ``deadlines``: the record's :func:`node_deadlines` (each caller has them already)."""
    out: set[str] = set()
    for n in record.rebalance or ():
        mark = (marks or {}).get(n)
        if n in alive and now >= deadlines.get(n, now) and (mark is None or mark.kind is NoticeKind.REBALANCE):
            out.add(n)
    return out


def has_interruption_taint(node: NodeView) -> bool:
    return any(t.key == INTERRUPTION_TAINT for t in node.taints)


# --- the plan -------------------------------------------------------------------


def plan(
    notices: Sequence[Notice],
    *,
    nodes: Sequence[NodeView],
    pods: Sequence[PodView],
    workloads: Sequence[Workload],
    config: Config,
    now: float,
    budgets: Sequence[Budget] = (),
    autoscalers: Sequence[Autoscaler] = (),
    replicaset_owners: Mapping[tuple[str, str], str] | None = None,
    resolved: Mapping[str, str] | None = None,
    namespace_annotations: Mapping[str, Mapping[str, str]] | None = None,
    node_notices: Mapping[str, NodeNotice] | None = None,
    surge_copy: bool = False,
) -> Plan:
    """One plan for a whole batch of notices (see the module docstring).

    ``node_notices``: the notice recorded on each tainted node (``spotguard.io/notice``).
    ``surge_copy`` (work in progress, issue 24): the surge is a spotguard-owned copy of the
    Deployment (``surgecopy``): the record is written, ``spec.replicas`` and the
    autoscaler are left alone.
    """
    node_by_name = {n.name: n for n in nodes}
    matched = match_nodes(notices, nodes, resolved)

    results: list[NoticeResult] = []
    doomed: dict[str, list[Notice]] = {}
    tainted: dict[str, list[Notice]] = {}
    node_events: dict[str, list[str]] = defaultdict(list)
    for n in notices:
        name = matched.get(n.instance_id, "")
        if not name:
            results.append(NoticeResult(n, "", Verdict.FOREIGN, f"no node runs instance {n.instance_id}"))
            continue
        verdict, reason = verdict_of(n, config, now)
        results.append(NoticeResult(n, name, verdict, reason))
        if verdict is Verdict.DOOMED:
            doomed.setdefault(name, []).append(n)
        elif verdict is Verdict.TAINT:
            tainted.setdefault(name, []).append(n)
        if verdict in (Verdict.DOOMED, Verdict.TAINT) and n.event_id not in node_events[name]:
            node_events[name].append(n.event_id)

    # One taint per node; the first notice (interruption first) names it. A node tainted
    # already is written again only where its recorded notice does not stand against this
    # one (:func:`mark_stands`).
    taints: list[TaintStep] = []
    recorded = node_notices or {}
    for name in sorted(set(doomed) | set(tainted)):
        node = node_by_name[name]
        first = sorted(
            doomed.get(name, []) + tainted.get(name, []),
            key=lambda x: (x.kind is not NoticeKind.INTERRUPTION, x.time, x.event_id),
        )[0]
        mark = node_notice(first, config, now)
        if has_interruption_taint(node):
            old = recorded.get(name)
            if old is not None and mark_stands(old, mark, now):
                continue
            if old is None:
                continue  # tainted before notices were recorded on nodes
        taints.append(TaintStep(name, first.event_id, first.kind, mark))

    # The nodes only a node autoscaler drains (no reclaim): a spot node's replacements need no
    # on-demand; an on-demand node's need it only as far as the floor does (per workload, below).
    drained_only = {name for name, asking in doomed.items() if all(n.kind is NoticeKind.DRAIN for n in asking)}
    capacity = {name: config.node_capacity(node_by_name[name].labels) for name in node_by_name}
    spot_drained = frozenset(name for name in drained_only if capacity[name] is Capacity.SPOT)
    on_demand_drained = frozenset(name for name in drained_only if capacity[name] is Capacity.ON_DEMAND)

    # Pods on doomed nodes, by workload.
    wl_by_key = {w.key: w for w in workloads}
    on_doomed: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    pods_by_key: dict[str, list[PodView]] = defaultdict(list)
    for p in pods:
        key = workload_key_of(p, replicaset_owners)
        if key is None and surge_copy and p.active and p.node_name in doomed:
            # A surge copy's pod (spot slots) on a node a later notice dooms: its Deployment's
            # surge covers that node too, so the copy grows by a replacement for it
            # (surgecopy.copy_step); the ReplicaSet would make one only after the reclaim.
            if (of := copy_workload_key(p)) is not None and of in wl_by_key:
                on_doomed[of][p.node_name] += 1
            continue
        if key is None or key not in wl_by_key:
            continue
        pods_by_key[key].append(p)
        if p.active and p.node_name in doomed:
            on_doomed[key][p.node_name] += 1

    surges: list[SurgeStep] = []
    warnings: list[QuorumWarning] = []
    skipped: list[str] = []
    ns_ann = namespace_annotations or {}
    budget_index = BudgetIndex(budgets)
    hpa_by_target = {(a.namespace, a.target_kind, a.target_name): a for a in autoscalers}
    for key in sorted(on_doomed):
        wl = wl_by_key[key]
        floor = floors.floor_for(wl, config, ns_ann.get(wl.namespace))
        if not floor.enabled:
            skipped.append(f"{key}: opted out")
            continue
        per_node = on_doomed[key]
        if wl.kind is Kind.STATEFULSET:
            all_doomed = sum(
                1
                for p in pods_by_key[key]
                if p.active and (p.node_name in doomed or _tainted(node_by_name.get(p.node_name)))
            )
            if wl.replicas - all_doomed < floor.on_demand:
                warnings.append(QuorumWarning(wl, all_doomed, floor.on_demand, wl.replicas, tuple(sorted(per_node))))
            continue
        surges.append(
            _surge_step(
                wl,
                per_node=per_node,
                doomed=doomed,
                wl_pods=pods_by_key[key],
                budgets=budget_index,
                autoscalers=[a] if (a := hpa_by_target.get((wl.namespace, str(wl.kind), wl.name))) else [],
                now=now,
                config=config,
                copy=surge_copy,
                spot_drained=spot_drained,
                spare=_spare_drains(
                    per_node, on_demand_drained, floor.on_demand - floor.surge,
                    kept=sum(
                        1
                        for p in pods_by_key[key]
                        if p.active
                        and capacity.get(p.node_name) is Capacity.ON_DEMAND
                        and p.node_name not in doomed
                        and not _tainted(node_by_name.get(p.node_name))
                    ),
                ),
            )
        )

    # The surges go out most at risk first: the controller-manager creates their pods through
    # a client limited to a few tens of pods a second, and a node autoscaler launches nodes
    # for them as they appear, so on a big notice the first written are the first served.
    # First the workloads with nothing serving on nodes that stay (a single replica), then
    # the smallest surges (each complete sooner: more workloads whole by the reclaim).
    def left(key: str) -> int:
        return sum(
            1
            for p in pods_by_key[key]
            if p.active and p.ready and p.node_name not in doomed and not _tainted(node_by_name.get(p.node_name))
        )

    surges.sort(key=lambda s: (left(s.workload.key) > 0, s.added, s.workload.key))
    return Plan(
        notices=tuple(results),
        taints=tuple(taints),
        surges=tuple(surges),
        warnings=tuple(warnings),
        doomed_nodes=frozenset(doomed),
        node_events={k: tuple(v) for k, v in node_events.items()},
        skipped=tuple(skipped),
    )


def _spare_drains(per_node: Mapping[str, int], drained: Collection[str], floor: int, kept: int) -> dict[str, int]:
    """node -> how many of a workload's ``per_node`` pods on the on-demand nodes an autoscaler
    only ``drained`` need no on-demand replacement: those beyond its base ``floor``, given the
    on-demand replicas it ``kept`` on nodes that stay. A replica waiting on on-demand for its
    return to spot, pinned to on-demand again by its replacement, would make the autoscaler
    launch an on-demand node for it (and the return's move of it undone)."""
    need = max(floor - kept, 0)
    out: dict[str, int] = {}
    for node in sorted(n for n in per_node if n in drained):
        pinned = min(per_node[node], need)
        need -= pinned
        if per_node[node] - pinned:
            out[node] = per_node[node] - pinned
    return out


def _tainted(node: NodeView | None) -> bool:
    return node is not None and has_interruption_taint(node)


class BudgetIndex:
    """Budgets by namespace, and by the first label of a plain ``matchLabels`` selector."""

    def __init__(self, budgets: Iterable[Budget]) -> None:
        self.by_label: dict[tuple[str, str, str], list[Budget]] = defaultdict(list)
        self.other: dict[str, list[Budget]] = defaultdict(list)  # expressions, empty selectors
        self.ours: dict[str, list[Budget]] = defaultdict(list)
        for b in budgets:
            if b.ours:
                self.ours[b.namespace].append(b)
                continue
            labels = (b.selector or {}).get("matchLabels") or {}
            if b.selector is not None and labels and not b.selector.get("matchExpressions"):
                key = min(labels)
                self.by_label[(b.namespace, key, str(labels[key]))].append(b)
            else:
                self.other[b.namespace].append(b)

    def candidates(self, namespace: str, labels: Mapping[str, str]) -> list[Budget]:
        out = list(self.other.get(namespace, ()))
        for k, v in labels.items():
            out.extend(self.by_label.get((namespace, k, v), ()))
        return out


def user_budgets(workload_pods: Sequence[PodView], budgets: Sequence[Budget] | BudgetIndex) -> list[Budget]:
    """The budgets not made by spotguard that select any of the pods."""
    index = budgets if isinstance(budgets, BudgetIndex) else BudgetIndex(budgets)
    label_sets: dict[tuple[str, frozenset[tuple[str, str]]], Mapping[str, str]] = {}
    for p in workload_pods:
        label_sets.setdefault((p.namespace, frozenset(p.labels.items())), p.labels)
    out: list[Budget] = []
    for (ns, _), labels in label_sets.items():
        for b in index.candidates(ns, labels):
            if b not in out and selector_matches(b.selector, labels):
                out.append(b)
    return out


def budget_name(workload: Workload) -> str:
    """The temporary budget's name: as the surge copy's (:func:`surge_copy_name`, the same
    prefix), cut with a digest past 253 characters (two long names that begin alike get two)."""
    return surge_copy_name(workload.name)


def autoscaler_for(workload: Workload, autoscalers: Sequence[Autoscaler]) -> Autoscaler | None:
    for a in autoscalers:
        if a.namespace == workload.namespace and a.target_kind == str(workload.kind) and a.target_name == workload.name:
            return a
    return None


def _surge_step(
    wl: Workload,
    *,
    per_node: Mapping[str, int],
    doomed: Mapping[str, Sequence[Notice]],
    wl_pods: Sequence[PodView],
    budgets: Sequence[Budget] | BudgetIndex,
    autoscalers: Sequence[Autoscaler],
    now: float,
    config: Config | None = None,
    copy: bool = False,
    spot_drained: Collection[str] = (),
    spare: Mapping[str, int] | None = None,
) -> SurgeStep:
    cfg = config or Config()
    existing = SurgeRecord.of(wl)
    if copy:
        autoscalers = ()  # the copy takes no replica from the owner's count: nothing to hold
    asking = [n for node in per_node for n in doomed[node]]
    if existing is not None and existing.done:
        if all(n.event_id in existing.events for n in asking):
            return SurgeStep(wl, existing, wl.replicas, 0, (), (), 0, 0)
        existing = None  # a new notice: a new surge, whatever the finished one covered
    covered = set(existing.nodes) if existing else set()
    new_nodes = tuple(sorted(n for n in per_node if n not in covered))
    counts = dict(existing.counts) if existing else {}
    added = 0
    for node in sorted(per_node):
        now_on = per_node[node]
        if node not in covered:
            added += now_on
        elif node in counts and now_on > counts[node]:
            # More of its pods on a covered doomed node than the surge replaces: placed there
            # after the surge (the node's taint was not written yet). Each needs one more.
            added += now_on - counts[node]
        elif node in counts:
            continue  # fewer now (evicted or gone): what was added stays
        counts[node] = now_on
    events: list[str] = list(existing.events) if existing else []
    new_events: list[str] = []
    for notice in sorted(asking, key=lambda x: (x.time, x.event_id)):
        if notice.event_id not in events:
            events.append(notice.event_id)
            new_events.append(notice.event_id)
    # Each node's deadline: an interruption (or a state change) takes over a rebalance's.
    until = dict(existing.until) if existing else {}
    soft = set(existing.rebalance or ()) if existing else set()
    for node in per_node:
        for notice in doomed[node]:
            t = deadline(notice, cfg, now)
            if notice.kind is NoticeKind.REBALANCE:
                if node not in until:
                    until[node] = t
                    soft.add(node)
            elif node not in until or until[node] <= now or t < until[node] or node in soft:
                until[node] = t  # the earliest reclaim time wins, a rebalance's end gives way
                soft.discard(node)
    # A spot node only drained stays in the set until a notice of the market's comes for it.
    drains = set(existing.spot_drains) if existing else set()
    drains -= {node for node in doomed if node not in spot_drained}
    drains |= {node for node in per_node if node in spot_drained}
    # An on-demand node only drained: what of its pods the floor does not need, set when the
    # surge first covers it (more pods placed there after: on-demand replacements, as before).
    spares = dict(existing.spare_drains) if existing else {}
    for node in list(spares):
        if any(n.kind is not NoticeKind.DRAIN for n in doomed.get(node, ())):
            spares.pop(node)  # a notice of the market's or the provider's: replaced on on-demand
    for node, k in (spare or {}).items():
        if node not in covered:
            spares[node] = k
    ready = sum(1 for p in wl_pods if p.active and p.ready)
    hpa = autoscaler_for(wl, autoscalers)
    index = budgets if isinstance(budgets, BudgetIndex) else BudgetIndex(budgets)
    own_budgets = index.ours.get(wl.namespace, [])
    users = user_budgets(wl_pods, index)

    if existing is None:
        original = wl.replicas
        total = added
        started = now
        serving = ready
    replicas = wl.replicas if copy else wl.replicas + added
    if existing is not None:
        total = existing.surge + added
        started = existing.started
        serving = existing.ready or ready
        written = existing.last_written
        if copy:
            original = wl.replicas  # never written by spotguard: the owner's count is what it is
            replicas = wl.replicas
        elif hpa is not None and wl.replicas < written and hpa.min_replicas < written:
            # Lowered while the autoscaler's minimum was not raised yet (a handling cut off
            # between the two writes): the autoscaler undid the surge. Put it back.
            original = existing.replicas
            replicas = written + added
        else:
            # Someone else changed the count during the surge: what they want is the new base.
            original = _owner_count(existing, wl.replicas, hpa)

    # The autoscaler: raise its minimum to the surged count (record the original once).
    hpa_step: AutoscalerStep | None = None
    hpa_name, hpa_min, hpa_max = "", None, None
    hpa_set = hpa_max_set = None
    if existing is not None and existing.hpa:
        hpa_name, hpa_min, hpa_max = existing.hpa, existing.hpa_min, existing.hpa_max
        hpa_set, hpa_max_set = existing.hpa_set, existing.hpa_max_set
    ending = hpa is not None and existing is not None and hpa.restored == restore_key(existing)
    if hpa is not None and not ending:
        if not hpa_name or hpa_name != hpa.name:
            hpa_name, hpa_min, hpa_max, hpa_set, hpa_max_set = hpa.name, hpa.min_replicas, None, None, None
        # The user changed a limit during the surge: their value is the one to put back.
        # (Not one still at a value spotguard set: a raise of ours that failed.)
        if existing is not None and hpa_set is not None and not existing.min_is_ours(hpa):
            hpa_min = hpa.min_replicas
        if existing is not None and hpa_max_set is not None and not existing.max_is_ours(hpa):
            hpa_max = hpa.max_replicas
        want_min = max(hpa.min_replicas, replicas)
        want_max = max(hpa.max_replicas, want_min)
        if hpa_max is None and want_max != hpa.max_replicas:
            hpa_max = hpa.max_replicas
        if want_min != hpa.min_replicas or want_max != hpa.max_replicas:
            hpa_step = AutoscalerStep(hpa.name, want_min, want_max, f"{started:.3f}")
        if want_min != hpa.min_replicas or hpa_set is not None:
            hpa_set = want_min
        if want_max != hpa.max_replicas or hpa_max_set is not None:
            hpa_max_set = want_max

    # The temporary budget: only where no budget of the user's selects the pods.
    budget_step: BudgetStep | None = None
    name = existing.budget if existing and existing.budget else ""
    if not users and (ready > 0 or name):
        name = name or budget_name(wl)
        if not any(b.name == name for b in own_budgets) and ready > 0:
            budget_step = BudgetStep(name, min(ready, serving) if serving else ready)
    elif users:
        name = ""

    record = SurgeRecord(
        replicas=original,
        surge=total,
        events=tuple(events),
        nodes=tuple(sorted(set(existing.nodes if existing else ()) | set(per_node))),
        started=started,
        hpa=hpa_name,
        hpa_min=hpa_min,
        hpa_max=hpa_max,
        budget=name,
        written=replicas,
        until=tuple(sorted(until.items())),
        hpa_set=hpa_set,
        hpa_max_set=hpa_max_set,
        ready=serving,
        counts=tuple(sorted(counts.items())),
        rebalance=tuple(sorted(soft)),
        copy=copy,
        spot_drains=tuple(sorted(drains & set(counts))),
        spare_drains=tuple(sorted((n, k) for n, k in spares.items() if n in counts)),
    )
    changed = (
        existing is None or existing.lost or record.to_json() != existing.to_json() or replicas != wl.replicas + added
    )
    record_nodes = set(record.nodes)
    doomed_pods = sum(1 for p in wl_pods if p.active and p.node_name in record_nodes)
    return SurgeStep(
        workload=wl,
        record=record,
        replicas=replicas,
        added=added,
        new_nodes=new_nodes,
        new_events=tuple(new_events),
        doomed_pods=doomed_pods,
        ready=ready,
        budget=budget_step,
        autoscaler=hpa_step,
        changed=changed,
    )


# --- scaling back ---------------------------------------------------------------


@dataclass(frozen=True)
class Finish:
    """A surge that is over: how to put the workload back."""

    workload: Workload
    record: SurgeRecord
    replicas: int  # spec.replicas to set (current minus the surge: keeps the user's changes)
    hpa_min: int | None  # restore the autoscaler's minReplicas to this (None: leave it)
    hpa_max: int | None
    budget: str  # delete this temporary budget ("" none)
    reason: str
    # Remove the annotation (its nodes are gone); False: keep it as a done record.
    remove: bool = True
    scale: bool = True  # False: the replicas were already put back (a done record), or never raised (a copy)
    event: surgelife.Event = surgelife.Event.REPLACEMENTS_READY  # what ended it


@dataclass(frozen=True)
class Waiting:
    workload: Workload
    reason: str
    state: surgelife.SurgeState = surgelife.SurgeState.COVERING  # COVERING or WAITING


def finish(
    *,
    workloads: Sequence[Workload],
    pods: Sequence[PodView],
    nodes: Sequence[NodeView],
    now: float,
    autoscalers: Sequence[Autoscaler] = (),
    replicaset_owners: Mapping[tuple[str, str], str] | None = None,
    max_seconds: float = SURGE_MAX_SECONDS,
    marks: Mapping[str, NodeNotice] | None = None,
    surge_copy: bool = False,
) -> tuple[list[Finish], list[Waiting]]:
    """Which recorded surges are over, and which still wait (with why).

    A surge waits while a pod of the workload is Ready on a doomed node that still
    exists and is before its deadline (the reclaim time, or the end of a rebalance's
    surge): a node past its reclaim time serves nothing, whatever the API still says
    about its pods. Then it waits for the replacements to be Ready, at most
    ``REPLACEMENT_GRACE`` seconds past the last deadline. It then goes back to the
    count the owner wants now (:func:`owner_replicas`), never below the autoscaler's
    minimum.

    ``marks``: the notice recorded on each node (and any the caller knows are still being
    written); a node's deadline is :func:`node_deadline`.

    ``surge_copy``: the surge is a copy (``surgecopy``), which no replace of the workload
    undoes: a lost record waits for the replacements like any other, and the finish
    scales nothing back (``scale`` False: the owner's count was never written).

    This counts; :func:`surgelife.life_step` decides (the surge's state machine): a surge
    UNWINDING is a :class:`Finish` (its steps: ``spotguard.policy.unwind``), one COVERING
    or WAITING a :class:`Waiting`, one HELD neither.
    """
    alive = {n.name for n in nodes}
    pods_by_key: dict[str, list[PodView]] = defaultdict(list)
    for p in pods:
        key = workload_key_of(p, replicaset_owners)
        if key is not None:
            pods_by_key[key].append(p)
    done: list[Finish] = []
    waiting: list[Waiting] = []
    for wl in workloads:
        record = SurgeRecord.of(wl)
        if record is None:
            continue
        deadlines, last = node_deadlines(record, marks, max_seconds)
        doomed_nodes = set(record.nodes)
        nodes_gone = not (doomed_nodes & alive)
        over = nodes_gone or now >= last + STALE_SECONDS
        if record.done:
            step = surgelife.life_step(surgelife.held_facts(over=over, lost=record.lost, copy=surge_copy, now=now))
            if step.state is surgelife.SurgeState.UNWINDING:
                done.append(Finish(wl, record, wl.replicas, None, None, "", step.reason, step.remove, step.scale,
                                   step.event))  # fmt: skip
            continue
        live = {n for n, t in deadlines.items() if n in alive and now < t}
        wl_pods = pods_by_key.get(wl.key, [])
        doomed_ready = sum(1 for p in wl_pods if p.active and p.ready and p.node_name in live)
        # A copy's surge: a rebalance's node that lives on serves (the copy's pods do not count).
        staying = rebalance_survivors(record, alive, now, marks, deadlines) if surge_copy else set()
        ready_elsewhere = sum(
            1 for p in wl_pods if p.active and p.ready and (p.node_name not in doomed_nodes or p.node_name in staying)
        )
        hpa = autoscaler_for(wl, autoscalers) if record.hpa else None
        hpa_min = hpa_max = None
        floor = 0
        if hpa is not None and hpa.name == record.hpa:
            # Restore only what still holds our value: a change the user made wins.
            if record.hpa_min is not None:
                ours = (
                    record.min_is_ours(hpa)
                    if record.hpa_set is not None
                    else hpa.min_replicas >= wl.replicas
                )
                if ours:
                    hpa_min = record.hpa_min
            if record.hpa_max is not None:
                ours = (
                    record.max_is_ours(hpa)
                    if record.hpa_max_set is not None
                    else hpa.max_replicas >= wl.replicas
                )
                if ours:
                    hpa_max = max(record.hpa_max, hpa_min or 1)
            floor = hpa.min_replicas if hpa_min is None else hpa_min
        target = max(_owner_count(record, wl.replicas, hpa), floor)
        holding = {p.node_name for p in wl_pods if p.active and p.ready and p.node_name in live}
        step = surgelife.life_step(
            surgelife.LifeFacts(
                held=False,
                over=over,
                doomed_ready=doomed_ready,
                drained_only=all(drained_only(record, marks, n) for n in holding),
                ready_elsewhere=ready_elsewhere,
                target=target,
                lost=record.lost,
                copy=surge_copy,
                last_deadline=last,
                now=now,
            )
        )
        if step.state is not surgelife.SurgeState.UNWINDING:
            waiting.append(Waiting(wl, step.reason, step.state))
            continue
        end = (step.reason, step.remove, step.scale, step.event)
        done.append(Finish(wl, record, target, hpa_min, hpa_max, record.budget, *end))
    return done, waiting


# How long past its last deadline a surge waits for replacements that are not Ready.
REPLACEMENT_GRACE = surgelife.REPLACEMENT_GRACE


def drained_only(record: SurgeRecord, marks: Mapping[str, NodeNotice] | None, node: str) -> bool:
    """Whether ``node`` of a surge is only drained by a node autoscaler (its mark a ``drain``
    notice, and not a node the surge keeps for a rebalance recommendation)."""
    mark = (marks or {}).get(node)
    return mark is not None and mark.kind is NoticeKind.DRAIN and node not in (record.rebalance or ())


def finished_record(record: SurgeRecord) -> SurgeRecord:
    """The record kept on a workload scaled back while its doomed nodes still exist."""
    return SurgeRecord(
        replicas=record.replicas,
        surge=0,
        events=record.events,
        nodes=record.nodes,
        started=record.started,
        done=True,
        until=record.until,
    )


def deadline_passed(
    record: SurgeRecord,
    now: float,
    max_seconds: float = SURGE_MAX_SECONDS,
    marks: Mapping[str, NodeNotice] | None = None,
) -> bool:
    """True when every node of a surge in progress is past its deadline (for alerting): the
    deadline :func:`finish` holds the surge to (:func:`node_deadline`, with the nodes' marks)."""
    default_until = record.started + max_seconds
    return all(now >= node_deadline(record, n, default_until, marks) for n in record.nodes) if record.nodes else False


def rebalance_node_lives(record: SurgeRecord, alive: Collection[str]) -> bool:
    """Whether a surge was started for a rebalance recommendation whose node still exists.

    Only the spot-interruption function ends such a surge: a reclaim for the same node may
    still be being retried there, and no other process knows it yet."""
    return any(n in alive for n in record.rebalance or ())


# --- draining (create before evict) -----------------------------------------------


@dataclass(frozen=True)
class Eviction:
    namespace: str
    pod: str
    workload: str
    node: str


def evictions(
    *,
    workloads: Sequence[Workload],
    pods: Sequence[PodView],
    nodes: Sequence[NodeView],
    now: float,
    replicaset_owners: Mapping[tuple[str, str], str] | None = None,
    max_seconds: float = SURGE_MAX_SECONDS,
    marks: Mapping[str, NodeNotice] | None = None,
) -> list[Eviction]:
    """The doomed pods spotguard may evict now, where it drains the doomed nodes itself.

    Per workload with a surge in progress: its pods on doomed nodes before their
    deadline, as many as leave at least the Ready count it had when the surge began
    (a doomed pod goes once a replacement is Ready elsewhere). Pods that are not
    Ready serve nothing and may go at once. The Eviction API still checks budgets.
    """
    alive = {n.name for n in nodes}
    pods_by_key: dict[str, list[PodView]] = defaultdict(list)
    copies_by_key: dict[str, list[PodView]] = defaultdict(list)  # the surge copies' pods
    for p in pods:
        key = workload_key_of(p, replicaset_owners)
        if key is not None:
            pods_by_key[key].append(p)
        elif (key := copy_workload_key(p)) is not None:
            copies_by_key[key].append(p)
    out: list[Eviction] = []
    for wl in workloads:
        record = SurgeRecord.of(wl)
        if record is None or record.done:
            continue
        deadlines, _last = node_deadlines(record, marks, max_seconds)
        live = {n for n, t in deadlines.items() if n in alive and now < t}
        if not live:
            continue
        wl_pods = [p for p in pods_by_key.get(wl.key, []) if p.active]
        doomed = sorted((p for p in wl_pods if p.node_name in live), key=lambda p: (p.ready, p.name))
        ready_total = sum(1 for p in wl_pods if p.ready and p.node_name not in set(record.nodes) - live)
        ready_total += sum(1 for p in copies_by_key.get(wl.key, []) if p.active and p.ready)
        keep = record.ready or record.replicas
        spare = ready_total - keep
        for p in doomed:
            if p.ready:
                if spare <= 0:
                    break
                spare -= 1
            out.append(Eviction(p.namespace, p.name, wl.key, p.node_name))
    return out
