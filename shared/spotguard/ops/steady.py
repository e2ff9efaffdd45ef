"""When a provisioned cluster is steady: the node autoscaler has nothing left to change.

A cluster whose nodes Karpenter or the Cluster Autoscaler launch is not at its steady
cost the moment its pods are Ready: the placement burst launched nodes for pods in
batches, and the autoscaler packs them together afterwards (Karpenter's consolidation
after ``consolidateAfter``, the Cluster Autoscaler's scale-down after
``--scale-down-unneeded-time``). A notice during that transient bills the burst's
nodes as the "steady" cost, for spotguard and for the alternatives alike. The cycle
and the baselines wait here, before the notice, until the nodes have stayed as they
are (no node added, removed, cordoned or tainted for disruption, no pod waiting, no
surge in progress) for as long as the autoscaler would take to act on what it sees.

:func:`quiet_seconds` is that time for the scenario's autoscalers; :class:`Settling`
follows the nodes and says when they have been quiet that long.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spotguard_sim import settings as settings_mod
from spotguard_sim.controllers import consolidation

Obj = dict[str, Any]
# Beyond the autoscaler's own delays: a drain's evictions and the replacement pods' start.
MARGIN_SECONDS = 30.0
# How long :func:`settle` waits at most (simulated seconds) before the notice comes anyway:
# this many quiet periods, and at least an hour. Karpenter consolidates one node a command,
# and each of spotguard's drains waits for its replacements to start: medium-karpenter's
# placement burst took 13 consolidations over about 30 minutes to pack.
LIMIT_PERIODS, LIMIT_SECONDS = 8, 3600.0
# The taints an autoscaler puts on a node it is about to remove.
_GOING = (consolidation.DISRUPTED_TAINT["key"], "ToBeDeletedByClusterAutoscaler")


def quiet_seconds(objects: list[Obj], settings: settings_mod.Settings) -> float:
    """How long the nodes must stay unchanged for the scenario's autoscalers to have nothing left
    to do: 0 for a cluster with neither (its nodes are the scenario's)."""
    waits: list[float] = []
    for pool in (o for o in objects if o.get("kind") == "NodePool"):
        disruption = (pool.get("spec") or {}).get("disruption") or {}
        after = consolidation.parse_duration(disruption.get("consolidateAfter", "0s"))
        # ``Never`` (None): the pool's nodes are never consolidated; only launches can change them.
        # its disruption controller polls (settings: upstream's pollingPeriod) and validates a
        # consolidation command 15 s later (commandValidationDelay)
        poll = settings.capacity.disruption_poll
        waits.append((after or 0.0) + consolidation.VALIDATION_SECONDS + 2 * poll)
    ca = settings.capacity.cluster_autoscaler
    if ca.node_groups:
        down = ca.scale_down
        waits.append(max(down.unneeded_time, down.delay_after_add) + 2 * ca.scan_interval)
    return max(waits) + MARGIN_SECONDS if waits else 0.0


def _signature(nodes: list[Obj]) -> frozenset[tuple[str, bool, bool]]:
    """What an autoscaler changes: which nodes exist, which are cordoned, which are being removed."""
    out = set()
    for n in nodes:
        spec = n.get("spec") or {}
        going = any(t.get("key") in _GOING for t in spec.get("taints") or [])
        out.add((str(n["metadata"]["name"]), bool(spec.get("unschedulable")), going))
    return frozenset(out)


@dataclass
class Settling:
    """Follows the nodes; :meth:`steady` once they have been quiet for ``quiet`` simulated seconds
    with nothing else moving (``busy``: pods waiting, surges in progress)."""

    quiet: float
    busy: Callable[[], bool]
    since: float = 0.0
    changes: int = 0  # how many times the nodes changed while settling
    _last: frozenset[tuple[str, bool, bool]] | None = field(default=None, repr=False)

    def steady(self, nodes: list[Obj], now: float) -> bool:
        signature = _signature(nodes)
        if signature != self._last or self.busy():
            if self._last is not None and signature != self._last:
                self.changes += 1
            self._last, self.since = signature, now
            return False
        return now - self.since >= self.quiet


@dataclass(frozen=True)
class Settled:
    """How the wait for a steady cluster went (simulated seconds)."""

    steady: bool
    quiet: float
    waited: float
    changes: int
    # ended before a quiet period because the cluster cost its steady hourly rate again with
    # nothing in progress (``settle``'s ``back``): the interruption's extra cost is all billed
    at_cost: bool = False

    def note(self, *, after: bool = False) -> str:
        """A sentence for the report: before the notice, or (``after``) after the return to spot."""
        since = "the return to spot" if after else "every pod was Ready"
        if self.at_cost:
            return (f"after the return, the bill ran until the cluster cost its steady rate before the notice "
                    f"again with nothing in progress, {self.waited:.0f}s after {since} ({self.changes} node changes "
                    f"meanwhile; the autoscaler may pack further, below that rate)")
        if self.steady:
            head = "after the return, the bill ran until" if after else "the notice came once"
            return (f"{head} the nodes had stayed unchanged for {self.quiet:g}s (the node autoscaler's "
                    f"delays), {self.waited:.0f}s after {since} ({self.changes} node changes meanwhile)")
        tail = ("the bill stops there, before the cluster was steady again" if after else
                "the notice came anyway, so the cost before it is a transient's, not the steady one")
        return f"the nodes were still changing {self.waited:.0f}s after {since} ({self.changes} changes): {tail}"

    def as_json(self) -> dict[str, Any]:
        return {"steady": self.steady, "quiet_seconds": self.quiet, "waited_seconds": round(self.waited, 1),
                "node_changes": self.changes, "back_at_steady_cost": self.at_cost}


def placing(tracker: Any, wanted: int) -> bool:
    """A pod still waits to be placed, or fewer than ``wanted`` serve (the tracker:
    :class:`spotguard.ops.serving.Serving`): what keeps every caller's cluster from being steady."""
    return bool(tracker.unbound() > 0 or sum(c.total for c in tracker.snapshot().values()) < wanted)


def calm(nodes: list[Obj]) -> bool:
    """No node cordoned or tainted by an autoscaler for removal (a replace may launch one)."""
    return not any(cordoned or going for _, cordoned, going in _signature(nodes))


def settle(sim: Any, objects: list[Obj], busy: Callable[[], bool], *,
           show: Callable[[], None] = lambda: None, settling: Settling | None = None,
           back: Callable[[], bool] | None = None) -> Settled | None:
    """Wait (polling the simulated cluster ``sim``) until its nodes are steady, at most
    ``LIMIT_PERIODS`` quiet periods or ``LIMIT_SECONDS``; None where the scenario has no node
    autoscaler (nothing to wait for). ``settling``: one already following the nodes (a phase
    before this wait fed it: its quiet time counts). ``back``: the cluster costs its steady
    rate (before the notice) again; with nothing busy and no node going, that ends the wait
    too (``at_cost``): what the autoscaler packs after it only costs less."""
    quiet = quiet_seconds(objects, sim.settings)
    if not quiet:
        return None
    settling = settling or Settling(quiet, busy)
    start, before = sim.clock.now(), settling.changes
    deadline = time.monotonic() + sim.clock.real(max(LIMIT_PERIODS * quiet, LIMIT_SECONDS)) + 10
    steady = False
    while not steady and time.monotonic() < deadline:
        show()
        nodes = sim.store.list("nodes")[0]
        steady = settling.steady(nodes, sim.clock.now())
        if not steady and back is not None and calm(nodes) and not busy() and back():
            return Settled(False, quiet, sim.clock.now() - start, settling.changes - before, at_cost=True)
        if not steady:
            time.sleep(0.1)
    return Settled(steady, quiet, sim.clock.now() - start, settling.changes - before)
