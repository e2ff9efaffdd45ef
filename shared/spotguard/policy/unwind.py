"""How a surge that is over ends: the ordered steps of its UNWINDING
(:mod:`spotguard.policy.surgelife`), which the handler carries out one by one. Pure; no I/O.

:func:`steps` lists them for one :class:`~spotguard.policy.interruption.Finish`, in this
order, each written only after the one before succeeded (a step that fails stops the end
there; the next pass finds the surge over again and lists the steps again, each of which
asks only for what is still to be done):

1. :class:`RankFirstToGo`: the deletion costs of the pods the scale back removes first
   (:func:`first_to_go`), before the autoscaler's minimum comes down: the autoscaler may
   scale down itself right after, and must remove the same pods.
2. :class:`EndProtection`: the surge replicas that stay are ordinary replicas again.
3. :class:`RestoreAutoscaler`: its limits back where they still hold spotguard's values.
4. :class:`DeleteBudget`: the temporary budget. Before the record: a record removed first
   would orphan the budget.
5. The last: :class:`DropLedgerEntry` (a lost record whose workload is at the owner's
   count: nothing to put back on it) or :class:`WriteBack` (``spec.replicas`` and the
   record in one patch guarded by the resourceVersion). On a conflict the handler reads the
   workload again and asks :func:`again` how it ends now.

A copy's surge (``surge_copy``, a Deployment) keeps its record on its copy
(``surgecopy.RECORD``): its last step is :class:`DeleteCopy` (the copy, its pods and the
record go in one delete) or, where a doomed node still exists, :class:`HoldCopy` (the copy at
0 keeps the finished record, so a notice delivered again for that node surges nothing). A
record still on the Deployment itself (a surge begun before records moved to the copy) is
removed first (:class:`WriteBack`, ``on_workload``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spotguard.policy import patches, surges
from spotguard.policy.interruption import Autoscaler, Finish, finish, finished_record, workload_key_of
from spotguard.policy.moves import DOOMED_FIRST, SURGE_FIRST
from spotguard.policy.notices import NodeNotice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import DELETION_COST, SURGE, SURGE_REPLICA, Kind, Workload, surge_copy_name

# A merge patch of one pod's annotations (None removes one).
PodNotes = tuple[tuple[PodView, Mapping[str, str | None]], ...]


@dataclass(frozen=True)
class DeleteCopy:
    name: str  # the copy's name (workloads.surge_copy_name): the handler deletes it by name where unlisted
    reason: str


@dataclass(frozen=True)
class HoldCopy:
    """The copy at 0 replicas, keeping the finished record while a doomed node exists."""

    name: str
    keep: SurgeRecord


@dataclass(frozen=True)
class RankFirstToGo:
    changes: PodNotes  # each pod's new deletion cost (only those whose cost changes)


@dataclass(frozen=True)
class EndProtection:
    changes: PodNotes  # each surge replica's protection removed (patches.surge_unprotection)


@dataclass(frozen=True)
class RestoreAutoscaler:
    record: SurgeRecord  # the surge (its autoscaler, the values it set: a conflict re-decides)
    min_replicas: int | None  # None: leave it
    max_replicas: int | None


@dataclass(frozen=True)
class DeleteBudget:
    name: str


@dataclass(frozen=True)
class DropLedgerEntry:
    """Nothing to put back on the workload: only the ledger's entry goes."""


@dataclass(frozen=True)
class WriteBack:
    replicas: int | None  # spec.replicas to write (None: leave it)
    keep: SurgeRecord | None  # the record left on the workload (None: removed)


Step = (
    DeleteCopy
    | HoldCopy
    | RankFirstToGo
    | EndProtection
    | RestoreAutoscaler
    | DeleteBudget
    | DropLedgerEntry
    | WriteBack
)


def steps(
    fin: Finish,
    pods: Sequence[PodView],
    marks: Mapping[str, NodeNotice],
    *,
    surge_copy: bool,
    on_workload: bool = True,
) -> list[Step]:
    """The end of ``fin``'s surge, step by step (the module's docstring says why this order).
    ``pods``: the pods as read (the workload's own are picked here); ``marks``: each node's
    notice; ``on_workload``: the workload object itself carries a surge record."""
    wl, record = fin.workload, fin.record
    out: list[Step] = []
    mine = [p for p in pods if not p.terminating and workload_key_of(p) == wl.key]
    if fin.scale and fin.replicas < wl.replicas:
        ranks = first_to_go(record, mine, wl.replicas - fin.replicas, marks)
        changes = tuple((p, {DELETION_COST: str(c)}) for p, c in ranks if p.annotations.get(DELETION_COST) != str(c))
        if changes:
            out.append(RankFirstToGo(changes))
    undo = tuple((p, notes) for p in mine if (notes := patches.surge_unprotection(p.annotations)))
    if undo:
        out.append(EndProtection(undo))
    if fin.hpa_min is not None or fin.hpa_max is not None:
        out.append(RestoreAutoscaler(record, fin.hpa_min, fin.hpa_max))
    if fin.budget:
        out.append(DeleteBudget(fin.budget))
    if surge_copy and wl.kind is Kind.DEPLOYMENT:
        last = write_back(fin)
        if on_workload:
            out.append(last)
        name = surge_copy_name(wl.name)
        out.append(DeleteCopy(name, fin.reason) if last.keep is None else HoldCopy(name, last.keep))
        return out
    if record.lost and (not fin.scale or fin.replicas == wl.replicas):
        # A scale back of ours whose ledger write failed, a replace at the owner's count, a
        # copy's surge: the workload holds nothing of the surge.
        out.append(DropLedgerEntry())
    else:
        out.append(write_back(fin))
    return out


def write_back(fin: Finish) -> WriteBack:
    """The end's last write: the count to scale back to (where it scales) and the record kept
    (HELD: a doomed node still exists) or removed."""
    return WriteBack(fin.replicas if fin.scale else None, None if fin.remove else finished_record(fin.record))


def again(
    fresh: Workload,
    fin: Finish,
    *,
    pods: Sequence[PodView],
    nodes: Sequence[NodeView],
    now: float,
    marks: Mapping[str, NodeNotice],
    surge_copy: bool,
) -> Finish | None:
    """The end's last write met a conflict (someone wrote the workload meanwhile): how the
    surge ends on the workload as read again (None: it is not over now, the next pass
    decides). A lost record stands in for the annotation the fresh copy lacks. The autoscaler
    was restored already: not again."""
    if fin.record.lost and SURGE not in fresh.annotations:
        notes = {**fresh.annotations, SURGE: fin.record.to_json(), surges.LOST: "true"}
        fresh = dataclasses.replace(fresh, annotations=notes)
    done, _ = finish(workloads=[fresh], pods=pods, nodes=nodes, now=now, marks=marks, surge_copy=surge_copy)
    if not done:
        return None
    return dataclasses.replace(done[0], hpa_min=None, hpa_max=None)


def limits_after_conflict(
    record: SurgeRecord, fresh: Autoscaler, want_min: int | None, want_max: int | None
) -> tuple[int | None, int | None]:
    """The limits to restore after a conflict on the autoscaler: a limit the user changed
    meanwhile (no longer what spotguard set) is theirs, and left as it is (None)."""
    if record.hpa_set is not None and not record.min_is_ours(fresh):
        want_min = None
    if record.hpa_max_set is not None and not record.max_is_ours(fresh):
        want_max = None
    return want_min, want_max


# --- the pods that go first -------------------------------------------------------------


def dies(record: SurgeRecord, node: str, marks: Mapping[str, NodeNotice]) -> bool:
    """Whether a surge's doomed ``node`` is dead at its end (its pods serve nothing).

    Only where the node's notice says its instance is terminated (or the node is gone): a
    rebalance recommendation's node lives on, and a stopped instance may start again, with
    spot pods worth keeping. The record says which of its nodes only had a rebalance
    recommendation: a node whose own notice is still the rebalance's (the interruption's
    taint write failed, and is retried) is dead when the record says an interruption took
    over; and the other way round, a node the record still names for a rebalance dies where
    its mark says a reclaim came."""
    mark = marks.get(node)
    if record.rebalance is not None:
        if node in record.rebalance:  # dead only where a reclaim's mark came since
            if mark is None:
                return False
            return mark.kind is not NoticeKind.REBALANCE and mark.action in ("", "terminate")
        return mark is None or mark.kind is NoticeKind.REBALANCE or mark.action in ("", "terminate")
    return mark is None or (mark.kind is not NoticeKind.REBALANCE and mark.action in ("", "terminate"))


def surge_replica(record: SurgeRecord, pod: PodView) -> bool:
    """A replica of the surge's own: marked so by the webhook, or created since the surge
    began (a surge pod the webhook let through unchanged, failing open, has no mark).
    (creationTimestamp has whole seconds.)"""
    return pod.annotations.get(SURGE_REPLICA) == "true" or (pod.created > 0 and pod.created >= int(record.started))


def first_to_go(
    record: SurgeRecord, pods: Sequence[PodView], remove: int, marks: Mapping[str, NodeNotice]
) -> list[tuple[PodView, int]]:
    """The deletion cost of each of the workload's pods (``pods``: its own, not terminating)
    that a scale back of ``remove`` replicas removes first.

    First its pods on dead nodes (:func:`dies`), at :data:`DOOMED_FIRST`: past its deadline a
    doomed node serves nothing, but the API keeps its pods Ready until the node lifecycle
    controller notices (50 s and more), and among equally Ready pods the ReplicaSet would as
    soon remove a serving replacement as a dead pod (found by tests/chaos). Then, as many as
    the dead pods leave to remove, the surge's own replicas (:func:`surge_replica`) on nodes
    the surge does not name, marked ones first, newest first, at :data:`SURGE_FIRST`: a
    rebalance recommendation not followed by an interruption keeps the spot pods on its
    living node and removes the extras (tests/chaos rebalance-storm-surge; without a rank the
    ReplicaSet removed a spot pod doubled up on the living node instead, under timeouts)."""
    doomed = {n for n in record.nodes if dies(record, n, marks)}
    dead = [p for p in pods if p.node_name in doomed]
    extras = sorted(
        (p for p in pods if p.node_name not in record.nodes and surge_replica(record, p)),
        key=lambda p: (p.annotations.get(SURGE_REPLICA) == "true", p.created, p.name),
        reverse=True,
    )[: max(0, remove - len(dead))]
    return [(p, DOOMED_FIRST) for p in dead] + [(p, SURGE_FIRST) for p in extras]
