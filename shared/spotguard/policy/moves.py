"""One move of the node-added reconcile, recorded on the workload, and how it ends.

A move changes which capacity some replicas of one workload run on:

- ``to-spot``: on-demand replicas above the floor are replaced on spot, a batch
  at a time (like a rolling update's surge: the pods of one move, bounded by the
  floor, the workload's budget and the cluster-wide maximum in flight, see
  :mod:`spotguard.policy.rebalance`);
- ``to-on-demand``: a workload below its floor gets an on-demand replica back.

Two methods:

- ``scale`` (Deployments, create before evict): the pods to remove are ranked
  first for deletion (``controller.kubernetes.io/pod-deletion-cost``), the
  workload is scaled up by as many (the admission webhook places the new pods on
  the capacity the floor asks for; a to-spot move's new pods require spot, so
  the provisioner launches a spot node for them where none has room: see
  :func:`launching`), and once the new pods are Ready the workload is
  scaled back to the owner's count: the ReplicaSet controller removes the
  ranked pods. Never fewer Ready replicas than before. A new pod that is
  Pending (waiting for a node being launched: Karpenter's 30-40 s, docs/sim.md)
  is progress: the move waits for it up to ``rebalance_move_timeout_seconds``.
  Then it is undone: the ranks of the pods whose replacement is not Ready are
  put back and the count goes back to the owner's; the ReplicaSet controller
  removes the Pending and not-Ready pods first (its ranking puts unscheduled,
  then pending, then not-Ready pods before any deletion cost), so the serving
  count never drops and the new replicas that did become Ready stay (their
  ranked on-demand pods go).
- ``evict`` (StatefulSets): the pod is evicted through the Eviction API (its
  budget decides) and comes back under the same name, placed by the admission
  webhook. Only one at a time, only while every replica is Ready and the
  quorum (the floor) holds without it.

The record (``spotguard.io/rebalance``, JSON on the workload) is the lock: it is
written with the workload's resourceVersion before anything else, so two
reconciles never move one workload at once, and a reconcile cut off half-way
is finished by the next one. :func:`progress` says what a recorded move needs
now. A move that made no progress (the new pods landed on the wrong capacity,
or none became Ready) leaves a ``hold`` on the record: the workload is left
alone until it ends, so nothing is retried in a loop.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement, placement_of
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import PodView
from spotguard.policy.workloads import DELETION_COST, MOVE_REQUIRES_SPOT, SURGE, Workload

MOVE = "spotguard.io/rebalance"
# A scale move's pass writes its record, waits for the admission webhook's cached copy of the
# workload to be older (nodeadded.reconciler), then scales: a record whose count is still the
# owner's and whose spec is unchanged since (the record's generation) is a move starting for
# this long, then a pass cut off (ended with a hold).
START_SECONDS = 30.0
# The deletion cost given to the pod a scale move removes: below every replica's
# (spot pods carry none, 0; the admission webhook gives on-demand pods 1000).
FIRST_TO_GO = -1_000_000
# The deletion cost the spot-interruption function gives the pods on a terminated
# node before it scales a surge back: below a move's FIRST_TO_GO, so that with a
# move in progress at the notice the ReplicaSet removes the dead pods before the
# move's ranked (living, serving) one; a tie would let it keep a dead pod instead.
DOOMED_FIRST = 2 * FIRST_TO_GO
# The deletion cost of the surge replicas a scale back removes beyond the dead pods: after
# a move's pod (whose removal is the move), before every other replica.
SURGE_FIRST = FIRST_TO_GO // 2
# A move whose new pod is not Ready by then is undone.
MOVE_TIMEOUT_SECONDS = 300.0
# After a move that made no progress, the workload is left alone this long.
HOLD_SECONDS = 600.0
# After a StatefulSet's eviction that a PodDisruptionBudget refused although its status allowed
# one when the pass read it (another evictor, a drainer or an autoscaler's consolidation, took
# the disruption in between), the workload waits this long (at most the hold above): the
# rival's pod back and the budget's status caught up. The planner asks the status again then
# (spotguard.policy.rebalance: a budget that allows no disruption is a skip, not a retry).
BUDGET_HOLD_SECONDS = 60.0


class Direction(enum.StrEnum):
    TO_SPOT = "to-spot"
    TO_ON_DEMAND = "to-on-demand"

    @property
    def target(self) -> Placement:
        return Placement.SPOT if self is Direction.TO_SPOT else Placement.ON_DEMAND


class Method(enum.StrEnum):
    SCALE = "scale"  # create before evict: scale up one, then back with the pod ranked first
    EVICT = "evict"  # the Eviction API (StatefulSets)


@dataclass(frozen=True)
class Marked:
    """A pod a batch move removes besides the record's first: its name, uid and deletion cost before."""

    pod: str
    uid: str
    cost: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pod": self.pod, "uid": self.uid}
        if self.cost is not None:
            out["cost"] = self.cost
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Marked:
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        cost = raw.get("cost")
        return cls(str(raw["pod"]), str(raw.get("uid") or ""), None if cost is None else str(cost))


@dataclass(frozen=True)
class MoveRecord:
    """What a move did, written as JSON on the workload (``spotguard.io/rebalance``)."""

    direction: Direction
    method: Method
    pod: str  # the pod that goes
    uid: str
    replicas: int  # the owner's count when the move began
    scaled_to: int  # what the move set spec.replicas to (replicas + 1; evict: replicas)
    started: float  # epoch seconds
    on_demand: int  # the workload's on-demand replicas when the move began
    cost: str | None = None  # the pod's deletion cost before (None: it had none)
    hold_until: float = 0.0  # > 0: the move is over; leave the workload alone until then
    reason: str = ""
    # The workload's autoscaler, whose minReplicas a scale move raises to ``scaled_to`` (an
    # autoscaler would otherwise undo the "+1" at its next sync): its name, its minReplicas
    # before, and the value the move set (put back only while it still holds).
    hpa: str = ""
    hpa_min: int | None = None
    hpa_set: int | None = None
    # A batch: the other pods this move removes (scale moves; ``scaled_to`` is replicas + 1 + len).
    more: tuple[Marked, ...] = ()
    # The workload's metadata.generation when the record was written (a record is an annotation:
    # it leaves the generation as it was); 0: not known (an older record).
    generation: int = 0
    # A scale move's "+k": False while only the record is written, True once the "+k" is (the
    # same JSON patch turns it True), None for an older record (not known).
    scaled: bool | None = None

    @property
    def held(self) -> bool:
        return self.hold_until > 0

    @property
    def marked(self) -> tuple[Marked, ...]:
        """Every pod the move removes, the first one first."""
        return (Marked(self.pod, self.uid, self.cost), *self.more) if self.pod else self.more

    @property
    def size(self) -> int:
        return 1 + len(self.more)

    def to_json(self) -> str:
        out: dict[str, Any] = {
            "direction": str(self.direction),
            "method": str(self.method),
            "pod": self.pod,
            "uid": self.uid,
            "replicas": self.replicas,
            "scaledTo": self.scaled_to,
            "started": round(self.started, 3),
            "onDemand": self.on_demand,
        }
        if self.cost is not None:
            out["cost"] = self.cost
        if self.hold_until:
            out["holdUntil"] = round(self.hold_until, 3)
        if self.reason:
            out["reason"] = self.reason[:300]
        if self.hpa and self.hpa_min is not None and self.hpa_set is not None:
            out["hpa"] = {"name": self.hpa, "minReplicas": self.hpa_min, "setMin": self.hpa_set}
        if self.more:
            out["more"] = [m.to_json() for m in self.more]
        if self.generation:
            out["generation"] = self.generation
        if self.scaled is not None:
            out["scaled"] = self.scaled
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> MoveRecord | None:
        """The record in ``text``, or None where it is not one (never raises)."""
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                return None
            cost = raw.get("cost")
            hpa = raw.get("hpa")
            if hpa is not None and not isinstance(hpa, dict):
                return None
            hpa = hpa or {}
            more = raw.get("more") or []
            if not isinstance(more, list):
                return None
            return cls(
                direction=Direction(raw["direction"]),
                method=Method(raw["method"]),
                pod=str(raw["pod"]),
                uid=str(raw.get("uid") or ""),
                replicas=_int(raw["replicas"]),
                scaled_to=_int(raw["scaledTo"]),
                started=float(raw["started"]),
                on_demand=_int(raw.get("onDemand", 0)),
                cost=None if cost is None else str(cost),
                hold_until=float(raw.get("holdUntil") or 0.0),
                reason=str(raw.get("reason") or ""),
                hpa=str(hpa.get("name") or ""),
                hpa_min=None if hpa.get("minReplicas") is None else _int(hpa["minReplicas"]),
                hpa_set=None if hpa.get("setMin") is None else _int(hpa["setMin"]),
                more=tuple(Marked.from_json(m) for m in more),
                generation=_int(raw.get("generation", 0)),
                scaled=raw["scaled"] if isinstance(raw.get("scaled"), bool) else None,
            )
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def of(cls, workload: Workload) -> MoveRecord | None:
        raw = workload.annotations.get(MOVE)
        return cls.parse(raw) if raw else None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not an integer: {value!r}")
    return value


def surge_in_progress(workload: Workload) -> bool:
    """An interruption surge that is not over (the spot-interruption function owns the workload)."""
    raw = workload.annotations.get(SURGE)
    if not raw:
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return True  # unreadable: leave it to its owner
    return not (isinstance(doc, dict) and doc.get("done") is True)


class Action(enum.StrEnum):
    WAIT = "wait"  # the new pod is not Ready yet
    FINISH = "finish"  # scale back to the owner's count (the ranked pod goes) and end the record
    ABORT = "abort"  # undo: restore the pod's cost, scale back, hold
    EVICT = "evict"  # (again) evict the recorded pod: the record was written, the eviction not done
    END = "end"  # remove the record (a hold that is over, a count someone else changed, an eviction done)
    HOLD = "hold"  # replace the record by a hold (the move ended without progress)


@dataclass(frozen=True)
class Progress:
    """What a recorded move needs now."""

    workload: Workload
    record: MoveRecord
    action: Action
    reason: str
    replicas: int | None = None  # spec.replicas to set (FINISH, ABORT)
    hold: MoveRecord | None = None  # the record to leave (FINISH/ABORT without progress, HOLD)
    restore: tuple[Marked, ...] = ()  # pods whose deletion cost goes back to what it was
    rank: tuple[Marked, ...] = ()  # pods (still) ranked first for deletion before the scale back

    @property
    def restore_cost(self) -> bool:
        return bool(self.restore)


def launching_move(workload: Workload) -> MoveRecord | None:
    """The move to spot under way on the workload whose new replicas are being created now, or
    None. Its replicas are placed on spot only (a required spot affinity, so the provisioner
    launches a spot node for them rather than the scheduler putting them in on-demand room).

    Not where the workload's count is above what the move set (``scaled_to``): someone else (its
    owner, an autoscaler) grew it during the move, and the replicas created for that are theirs,
    placed as any spot slot is (spot preferred, not required). With the requirement they waited
    Pending for a spot launch that might never come, and stayed Pending after the move (chaos
    spot-refused-after-reclaim under 500s: worker served 35 of the 38 its owner asked).

    Nor while an interruption surge is in progress on the workload (a notice, a node
    autoscaler's drain): the move waits for it (:func:`progress`), and the replicas created now
    replace pods going away. With the requirement, a drained pod's replacement waited Pending
    while EC2 refused spot, the surge's copy kept serving for it until the surge's deadline and
    went then: one replica fewer serving (chaos spot-refused-after-reclaim under 500s: web 6 -> 5,
    api 3 -> 2, cart 4 -> 3 when the copy of a Karpenter consolidation's drain surge went, 300 s
    past the surge's deadline).

    A replica re-created during the move otherwise (one of its pods evicted or deleted) cannot
    be told from the move's own and still gets it: :func:`stranded` is the net for those."""
    record = MoveRecord.of(workload)
    if record is None or record.held or record.direction is not Direction.TO_SPOT:
        return None
    if workload.replicas > record.scaled_to or surge_in_progress(workload):
        return None
    return record


def launching(workload: Workload) -> bool:
    """A move to spot is under way on the workload and its new replicas are being created now
    (:func:`launching_move`)."""
    return launching_move(workload) is not None


def move_id(record: MoveRecord) -> str:
    """The name of a move, as its new replicas carry it (``MOVE_REQUIRES_SPOT``): when it began,
    as its record holds it (milliseconds), distinct for each move of one workload."""
    return f"{round(record.started, 3):.3f}"


def stranded(
    pod: PodView, workload: Workload, now: float, *, settle: float = START_SECONDS, surge_copy: bool = False
) -> bool:
    """Whether ``pod`` (of ``workload``) waits Pending on the spot requirement a move to spot gave
    it (``MOVE_REQUIRES_SPOT``, set by the admission webhook with the requirement) when the
    admission webhook would not give it now (:func:`launching_move`): that move ended, undone,
    held, another move since, the count above the move's (its owner's replicas), or an
    interruption surge in progress (``surge_copy``: a surge copy serves the workload, whether
    or not its record is on it). Nothing else ever takes such a pod: an undone move's scale
    back removes as many Pending pods as it added, not one re-created meanwhile (a drained or
    evicted replica's replacement admitted during the move), and where the owner changed the
    count during the move nothing scales back at all. While EC2 refuses spot it would stay
    Pending for good (or, under a surge, until the surge's copy went at its deadline); deleted
    (through the Eviction API: budgets do not count a Pending pod), its controller creates it
    again, placed as usual. It never served, so nothing is lost.

    Only a pod with no node and at least ``settle`` seconds old (``now`` and its creation on the
    API server's clock): a read of the workload that predates the move's record (a list retried
    under faults) beside a later read of its pods cannot take a new replica of a move just begun.
    A user's own spot requirement never carries the annotation."""
    tag = pod.annotations.get(MOVE_REQUIRES_SPOT)
    if not tag or pod.node_name or not pod.active:
        return False
    created = pod.created
    if not created or now - created < settle:
        return False
    move = None if surge_copy else launching_move(workload)
    return move is None or move_id(move) != tag


def autoscaler_restore(record: MoveRecord, current_min: int | None) -> int | None:
    """The minReplicas to put back on the autoscaler a move raised, when the move ends, or None:
    nothing to write (nothing raised, the autoscaler gone, or someone else changed its minimum
    during the move: their value stays)."""
    if not record.hpa or record.hpa_min is None or record.hpa_set is None or current_min is None:
        return None
    return record.hpa_min if current_min == record.hpa_set and record.hpa_min != current_min else None


def without_autoscaler(record: MoveRecord) -> MoveRecord:
    """The record once its autoscaler's minimum is back (a hold keeps nothing to restore)."""
    return replace(record, hpa="", hpa_min=None, hpa_set=None)


def held(record: MoveRecord, now: float, reason: str, seconds: float = HOLD_SECONDS) -> MoveRecord:
    return replace(record, hold_until=now + seconds, reason=reason)


def count_on(pods: Sequence[PodView], capacity_of: Mapping[str, Capacity], where: Placement) -> int:
    return sum(1 for p in pods if p.active and placement_of(p, capacity_of) is where)


def progress(
    state: WorkloadState,
    record: MoveRecord,
    capacity_of: Mapping[str, Capacity],
    now: float,
    *,
    timeout: float = MOVE_TIMEOUT_SECONDS,
    hold_seconds: float = HOLD_SECONDS,
    autoscaler_min: int | None = None,
) -> Progress:
    """What the recorded move of ``state``'s workload needs now (see the module docstring).

    ``autoscaler_min``: the minReplicas of the workload's autoscaler now (None: none)."""
    wl = state.workload

    def held(record: MoveRecord, now: float, reason: str) -> MoveRecord:
        return replace(record, hold_until=now + hold_seconds, reason=reason)

    active = [p for p in state.pods if p.active]
    uids = {m.uid for m in record.marked if m.uid}
    marked = [p for p in active if p.uid in uids]
    present = {p.uid for p in marked}
    # The pods the move ranked that are still there (a scale move's: an eviction ranks none).
    still = tuple(m for m in record.marked if m.uid in present) if record.method is Method.SCALE else ()
    # Of those, the ones whose cost is not back yet: a pass whose restore failed half-way (one
    # patch a pod) keeps what it restored, and the next patches only the rest. Patching every
    # ranked pod each pass, a move of 30 replicas under 20 % failed requests never got all 30
    # through in one pass (0.8^30) and stayed in progress for good (chaos spot-refused-after-
    # reclaim under 500s: worker's move, 58 failed passes in 50 simulated minutes).
    cost_now = {p.uid: p.annotations.get(DELETION_COST) for p in marked}

    def unrestored(ranked: tuple[Marked, ...]) -> tuple[Marked, ...]:
        return tuple(m for m in ranked if cost_now.get(m.uid) != m.cost)
    if record.held:
        if now >= record.hold_until:
            # The pods a move ranked first that are still there get their deletion cost back.
            return Progress(wl, record, Action.END, "hold over", restore=unrestored(still))
        return Progress(wl, record, Action.WAIT, f"held: {record.reason}")
    if surge_in_progress(wl):
        return Progress(wl, record, Action.WAIT, "an interruption surge is in progress")
    age = now - record.started
    if record.method is Method.EVICT:
        first = marked[0] if marked else None
        return _evict_progress(
            record, wl, active, marked=first, capacity_of=capacity_of, now=now, timeout=timeout, hold=held
        )
    if record.method is Method.SCALE and record.scaled is False and wl.replicas == record.replicas != record.scaled_to:
        # The count is the owner's and the "+k" has not followed the record (an autoscaler whose
        # minimum the move raised may have made it itself: then the count is the move's): its
        # pass writes it once the admission webhook's cache caught up (seconds). Past that, it
        # never will: the count changed in between (an
        # interruption surge begun meanwhile, whose scale back then put the owner's count back;
        # another writer), or the pass was cut off. The move never began: no "someone else" to
        # hold against. Its record goes (its ranks and any raised minimum back); the next pass plans.
        if age < START_SECONDS:
            return Progress(wl, record, Action.WAIT, "starting: the count follows the record")
        # Only the ranks not back yet: restoring every ranked pod each pass, worker's never-begun
        # batch of 10 under 20 % failed requests got all 10 through in one pass one time in nine
        # and kept its record, a move in progress, for minutes (chaos spot-refused-after-reclaim).
        return Progress(
            wl,
            record,
            Action.END,
            "the count changed before the move's scale-up: never begun",
            restore=unrestored(still),
        )
    if (
        wl.replicas == record.replicas != record.scaled_to
        and record.generation
        and wl.generation == record.generation
        and age < START_SECONDS
    ):
        # Its pass writes the record first and the "+k" after the admission webhook's cache has
        # caught up (seconds): another reconcile reading in between (the spec untouched since the
        # record: the same generation) is not "someone else". A count put back after the "+k"
        # comes with a newer generation: theirs wins, below.
        return Progress(wl, record, Action.WAIT, "starting: the count follows the record")
    if wl.replicas != record.scaled_to and not _our_minimum(record, wl.replicas, autoscaler_min):
        # Someone else set the count meanwhile (an autoscaler, GitOps, a person): theirs wins.
        # Holding keeps an autoscaler that scales it straight back from a loop of moves.
        why = f"replicas changed to {wl.replicas} by someone else"
        return Progress(wl, record, Action.HOLD, why, restore=unrestored(still), hold=held(record, now, why))
    others = [p for p in active if p.uid not in present]
    ready_others = sum(1 for p in others if p.ready)
    if ready_others >= record.replicas:
        moved = _progressed(record, others, capacity_of)
        hold = None if moved else held(record, now, "the new replica did not land on " + str(record.direction.target))
        why = (
            f"{ready_others} replicas Ready without the {len(marked)} it replaces"
            if marked
            # A pass that scaled back (the ranked pods went first) and lost the record's removal
            # to a status write: this one removes the record.
            else f"{ready_others} replicas Ready; the {record.size} it replaces already gone"
        )
        return Progress(
            wl,
            record,
            Action.FINISH,
            why,
            replicas=record.replicas,
            hold=hold,
            rank=still,
        )
    if age > timeout:
        # The new replicas that are Ready (created since the move began) replace as many of the
        # ranked pods; the others' ranks go back, and the scale back removes the new pods that
        # are not Ready (the ReplicaSet's ranking takes Pending and not-Ready pods first).
        fresh = sum(1 for p in others if p.ready and p.created >= int(record.started))
        keep = min(fresh, len(still))
        if keep and record.direction is Direction.TO_SPOT:
            return Progress(
                wl,
                record,
                Action.FINISH,
                f"{keep} of {record.size} new replicas Ready within {int(timeout)}s; the rest undone",
                replicas=record.replicas,
                restore=unrestored(still[keep:]),
                rank=still[:keep],
            )
        return Progress(
            wl,
            record,
            Action.ABORT,
            f"the new replica was not Ready within {int(timeout)}s",
            replicas=record.replicas,
            restore=unrestored(still),
            hold=held(record, now, "the new replica did not become Ready"),
        )
    pending = sum(1 for p in others if not p.node_name)
    waiting = f"; {pending} Pending (a node may be launching for them)" if pending else ""
    return Progress(
        wl, record, Action.WAIT, f"{ready_others} of {record.replicas} Ready besides the moving pods{waiting}"
    )


def _our_minimum(record: MoveRecord, replicas: int, autoscaler_min: int | None) -> bool:
    """The count is above the move's only because the autoscaler held the minimum the move
    raised it to after the scale back (its restore failed, or the autoscaler synced between
    the two writes) and put the "+1" back. Not someone else's change: the move finishes, and
    scales back again. The minimum is still the move's, or back at the user's value."""
    return (
        record.hpa_set is not None
        and autoscaler_min in (record.hpa_set, record.hpa_min)
        and record.scaled_to < replicas <= record.hpa_set
    )


def _progressed(record: MoveRecord, pods: Sequence[PodView], capacity_of: Mapping[str, Capacity]) -> bool:
    """Did the workload (without the pod that goes) move the way the record wanted?"""
    on_demand = count_on(pods, capacity_of, Placement.ON_DEMAND)
    if record.direction is Direction.TO_SPOT:
        return on_demand < record.on_demand
    return on_demand > record.on_demand


def _evict_progress(
    record: MoveRecord,
    wl: Workload,
    active: Sequence[PodView],
    *,
    marked: PodView | None,
    capacity_of: Mapping[str, Capacity],
    now: float,
    timeout: float,
    hold: Callable[[MoveRecord, float, str], MoveRecord],
) -> Progress:
    held = hold
    age = now - record.started
    if marked is not None:
        if age > timeout:
            return Progress(wl, record, Action.HOLD, "the pod was not evicted", hold=held(record, now, "not evicted"))
        return Progress(wl, record, Action.EVICT, f"{record.pod} is still there")
    back = next((p for p in active if p.name == record.pod), None)
    if back is not None and back.ready and back.node_name:
        if placement_of(back, capacity_of) is record.direction.target:
            return Progress(wl, record, Action.END, f"{record.pod} is back, on {record.direction.target}")
        return Progress(
            wl,
            record,
            Action.HOLD,
            f"{record.pod} came back on the same capacity",
            hold=held(record, now, f"{record.pod} did not land on {record.direction.target}"),
        )
    if age > timeout:
        return Progress(
            wl, record, Action.HOLD, f"{record.pod} is not back", hold=held(record, now, f"{record.pod} not Ready")
        )
    return Progress(wl, record, Action.WAIT, f"waiting for {record.pod} to come back Ready")
