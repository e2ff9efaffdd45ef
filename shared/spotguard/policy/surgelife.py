"""A surge's life: one state machine, from the notice to nothing left. Pure; no I/O.

Each pass (a handling or a reconcile) :func:`spotguard.policy.interruption.finish` counts
what one surging workload shows (:class:`LifeFacts`) and asks :func:`life_step` where its
surge is and which event put it there. Nothing is stored but the surge record itself
(``spotguard.io/surge``): the state is read again from the cluster on every pass, as the
copy's is (:func:`spotguard.policy.surgecopy.copy_step`). An UNWINDING surge's end is the
ordered steps of :func:`spotguard.policy.unwind.steps`, which the handler carries out.

States:

- COVERING: a pod of the workload is still Ready on a doomed node before its deadline (the
  reclaim time, or a rebalance's end). The surge stands in beside it: the replica surge's
  extra replicas, or the copy (whose own machine then says COVERING or HANDING_BACK).
- WAITING: the doomed pods are gone, or their nodes past the deadline (a node past its
  reclaim serves nothing, whatever the API says of its pods), but fewer than the owner's
  count are Ready on nodes that stay; at most :data:`REPLACEMENT_GRACE` past the last deadline.
- UNWINDING: the surge is over; its end is carried out step by step (a step that fails
  leaves it UNWINDING: the next pass finds it over again and carries the steps out again).
- HELD: scaled back while a doomed node still exists: the record is kept, ``done``
  (surge 0), so that a replayed notice changes nothing; a notice with a new event id
  surges again (COVERING).

and no record: nothing of the surge left (the end of its life, or before it).

Events (:class:`Event`): NOTICE (the plan, :func:`~spotguard.policy.interruption.plan`,
writes the record), DOOMED_PODS_GONE, REPLACEMENTS_READY, DRAINED_REPLACED (the only pods
left on doomed nodes are on nodes an autoscaler drains, and the replacements are Ready: they
go with the scale back), GRACE_RAN_OUT, RECORD_LOST (the workload replaced: only the
ledger's copy of the record is left, and the replica surge ends at the owner's count),
NODES_GONE (a held record's doomed nodes are gone or stale), UNWOUND (every step of the end
carried out). The owner's count is no event of its own: it is the target the replacements
are counted against (:func:`~spotguard.policy.interruption.owner_replicas`), so a count
lowered meanwhile brings REPLACEMENTS_READY sooner; and at the end it decides whether a
lost record's workload needs a write at all (:func:`spotguard.policy.unwind.steps`). A
conflict on the end's last write is the pass deciding again on the workload read anew
(:func:`spotguard.policy.unwind.again`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# How long past its last deadline a surge waits for replacements that are not Ready.
REPLACEMENT_GRACE = 300.0


class SurgeState(enum.StrEnum):
    COVERING = "covering"
    WAITING = "waiting"
    UNWINDING = "unwinding"
    HELD = "held"


class Event(enum.StrEnum):
    NOTICE = "notice"
    DOOMED_PODS_GONE = "doomed-pods-gone"
    REPLACEMENTS_READY = "replacements-ready"
    DRAINED_REPLACED = "drained-replaced"
    GRACE_RAN_OUT = "grace-ran-out"
    RECORD_LOST = "record-lost"
    NODES_GONE = "nodes-gone"
    UNWOUND = "unwound"


@dataclass(frozen=True)
class LifeFacts:
    """What one pass counts about one surging workload (``interruption.finish`` counts)."""

    held: bool  # the record is done (scaled back while a doomed node still existed)
    over: bool  # its doomed nodes are gone, or all stale (past their deadline by STALE_SECONDS)
    doomed_ready: int  # its Ready pods on doomed nodes that exist, before their deadline
    drained_only: bool  # each node holding those is only drained by a node autoscaler
    ready_elsewhere: int  # its Ready pods on nodes the surge does not name
    target: int  # the count to get back to: the owner's now, never below the autoscaler's minimum
    lost: bool  # the record is the ledger's (the workload was replaced)
    copy: bool  # the surge is a copy (surgecopy): it wrote no count of the owner's
    last_deadline: float  # the latest deadline of its doomed nodes
    now: float


@dataclass(frozen=True)
class LifeStep:
    """Where the surge is and the event that put it there; for UNWINDING, how it ends."""

    state: SurgeState
    event: Event
    reason: str
    remove: bool = True  # the end removes the record (False: keeps it, done: HELD after)
    scale: bool = True  # the end writes spec.replicas (False: a copy, or already scaled back)


def held_facts(*, over: bool, lost: bool, copy: bool, now: float) -> LifeFacts:
    """The facts of a held record (``done``): only whether its doomed nodes are over counts."""
    return LifeFacts(True, over, 0, False, 0, 0, lost, copy, now, now)


def life_step(f: LifeFacts) -> LifeStep:
    """The surge's state this pass, and the event that put it there."""
    if f.held:
        if f.over:
            return LifeStep(SurgeState.UNWINDING, Event.NODES_GONE, "doomed nodes gone", True, False)
        return LifeStep(SurgeState.HELD, Event.UNWOUND, "scaled back; a doomed node still exists", False, False)
    if f.doomed_ready:
        if f.ready_elsewhere >= f.target and not f.lost and not f.copy and f.drained_only:
            # A node an autoscaler drains: its pods go with the scale back (ranked first), not
            # by the autoscaler's evictions (which the guard holds for this): an evicted pod's
            # ReplicaSet, still at the surged count, would create one more pod, and the
            # autoscaler launch a node for it, a node it removes again once the surge is over.
            why = "replacements Ready: the drained pods go with the scale back"
            return LifeStep(SurgeState.UNWINDING, Event.DRAINED_REPLACED, why, False, True)
        return LifeStep(SurgeState.COVERING, Event.NOTICE, f"{f.doomed_ready} pods still Ready on doomed nodes")
    # A copy's surge never wrote the owner's count: nothing to scale back.
    remove, scale = f.over or f.lost, not f.copy
    if f.lost and not f.copy:
        why = "the surge record was lost (the workload was replaced): the owner's spec wins"
        return LifeStep(SurgeState.UNWINDING, Event.RECORD_LOST, why, remove, scale)
    if f.ready_elsewhere < f.target and f.now < f.last_deadline + REPLACEMENT_GRACE:
        why = f"{f.ready_elsewhere} of {f.target} replacements Ready"
        return LifeStep(SurgeState.WAITING, Event.DOOMED_PODS_GONE, why)
    if f.ready_elsewhere < f.target:
        why = f"surge older than its deadline by {int(REPLACEMENT_GRACE)}s"
        return LifeStep(SurgeState.UNWINDING, Event.GRACE_RAN_OUT, why, remove, scale)
    return LifeStep(
        SurgeState.UNWINDING, Event.REPLACEMENTS_READY, "replacements Ready and the doomed pods gone", remove, scale
    )
