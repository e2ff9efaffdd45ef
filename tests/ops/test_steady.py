"""When a provisioned cluster is steady (spotguard.ops.steady)."""

from __future__ import annotations

import types

from spotguard.ops import steady
from spotguard_sim import capacity, catalogue
from spotguard_sim import settings as settings_mod
from spotguard_sim.nodegroups import ClusterAutoscaler, NodeGroup


def pool(after: str | None) -> dict:
    disruption = {"consolidationPolicy": "WhenEmptyOrUnderutilized"}
    if after is not None:
        disruption["consolidateAfter"] = after
    return {"kind": "NodePool", "metadata": {"name": "p"}, "spec": {"disruption": disruption}}


def node(name: str, *, taints: list | None = None, cordoned: bool = False) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": taints or [], "unschedulable": cordoned}}


def test_the_quiet_period_is_the_autoscalers_own_delays() -> None:
    plain = settings_mod.Settings()
    # fixed nodes: nothing to wait for
    assert steady.quiet_seconds([], plain) == 0.0
    # Karpenter: consolidateAfter, the command's validation and two polls, and a margin
    assert steady.quiet_seconds([pool("30s")], plain) == 30 + 15 + 20 + 30
    assert steady.quiet_seconds([pool("5m"), pool("30s")], plain) == 300 + 15 + 20 + 30
    assert steady.quiet_seconds([pool("Never")], plain) == 15 + 20 + 30
    # the Cluster Autoscaler: the longer of scale-down-unneeded-time and delay-after-add, two scans
    m5 = catalogue.get("m5.large")
    assert m5 is not None
    group = NodeGroup("od", m5, "on-demand")
    ca = settings_mod.Settings(capacity=capacity.Capacity(cluster_autoscaler=ClusterAutoscaler(node_groups=(group,))))
    assert steady.quiet_seconds([], ca) == 600 + 20 + 30


def test_the_nodes_are_steady_only_after_a_quiet_period_with_nothing_moving() -> None:
    busy = [False]
    s = steady.Settling(100.0, lambda: busy[0])
    nodes = [node("a"), node("b")]
    assert not s.steady(nodes, 0.0)
    assert not s.steady(nodes, 99.0)
    assert s.steady(nodes, 100.0)
    # a node tainted for removal, cordoned, added or gone starts the period again
    for changed in ([node("a", taints=[{"key": "karpenter.sh/disrupted"}]), node("b")],
                    [node("a", cordoned=True), node("b")], [*nodes, node("c")], [node("a")]):
        s = steady.Settling(100.0, lambda: False)
        s.steady(nodes, 0.0)
        assert not s.steady(changed, 150.0)
        assert not s.steady(changed, 249.0) and s.steady(changed, 250.0)
        assert s.changes == 1
    # pods waiting or a surge in progress hold it too, however long the nodes stay
    s = steady.Settling(100.0, lambda: busy[0])
    s.steady(nodes, 0.0)
    busy[0] = True
    assert not s.steady(nodes, 500.0)
    busy[0] = False
    assert not s.steady(nodes, 550.0) and s.steady(nodes, 600.0)
    # another taint (not an autoscaler's) is no change of the autoscaler's
    s = steady.Settling(10.0, lambda: False)
    s.steady(nodes, 0.0)
    assert s.steady([node("a", taints=[{"key": "spotguard.io/interruption"}]), node("b")], 10.0)


class _Clock:
    """Simulated time that moves 10 s at each read (the wait's polls), at once in real time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        self.t += 10.0
        return self.t

    def real(self, seconds: float) -> float:
        return seconds / 1000.0


class _Store:
    def __init__(self, nodes: list[dict]) -> None:
        self.nodes = nodes

    def list(self, resource: str) -> tuple[list[dict], str]:
        assert resource == "nodes"
        return [dict(n) for n in self.nodes], "1"


def test_a_wait_after_a_phase_that_followed_the_nodes_counts_the_quiet_time_already_seen() -> None:
    """The cycle's return to spot follows the nodes with the same Settling as the steady wait
    after it: nodes quiet through the end of the return need no second quiet period (the
    --drainer demo waited one after the return's own "nothing moved" wait)."""
    nodes = [node("a"), node("b")]
    sim = types.SimpleNamespace(settings=settings_mod.Settings(), clock=_Clock(1000.0), store=_Store(nodes))
    quiet = steady.quiet_seconds([pool("30s")], sim.settings)
    # GIVEN a settling that saw the nodes unchanged since t=0, and a change at t=900 (one change)
    fed = steady.Settling(quiet, lambda: False)
    fed.steady([node("a")], 0.0)
    fed.steady(nodes, 900.0)
    # WHEN the wait starts at t=1010 with it
    settled = steady.settle(sim, [pool("30s")], lambda: False, settling=fed)
    # THEN it is over at its first look (quiet since 900), counting no change of its own
    assert settled is not None and settled.steady and settled.changes == 0 and settled.waited < quiet
    # AND without it the same wait takes a whole quiet period
    sim.clock = _Clock(1000.0)
    fresh = steady.settle(sim, [pool("30s")], lambda: False)
    assert fresh is not None and fresh.steady and fresh.waited >= quiet


def test_the_wait_after_the_return_ends_once_the_cluster_costs_its_steady_rate_with_nothing_in_progress() -> None:
    """The --drainer demo waited a whole quiet period after each late consolidation although the
    cluster already cost its steady rate: what the autoscaler packs after that costs less."""
    nodes = [node("a"), node("b")]
    sim = types.SimpleNamespace(settings=settings_mod.Settings(), clock=_Clock(0.0), store=_Store(nodes))
    quiet = steady.quiet_seconds([pool("30s")], sim.settings)
    settled = steady.settle(sim, [pool("30s")], lambda: False, back=lambda: True)
    assert settled is not None and settled.at_cost and not settled.steady and settled.waited < quiet
    assert settled.as_json()["back_at_steady_cost"] is True
    assert "cost its steady rate" in settled.note(after=True)
    # not while a node is going or the rate is above steady: then a quiet period as before
    for going, back in ((True, True), (False, False)):
        sim.clock = _Clock(0.0)
        sim.store = _Store([node("a", taints=[{"key": "karpenter.sh/disrupted"}]) if going else node("a"), node("b")])
        out = steady.settle(sim, [pool("30s")], lambda: False, back=lambda back=back: back)
        assert out is not None and out.steady and not out.at_cost and out.waited >= quiet
    # nor while something is in progress: only once it is over
    sim.clock, sim.store = _Clock(0.0), _Store(nodes)
    polls = [0]

    def busy() -> bool:
        polls[0] += 1
        return polls[0] <= 20

    out = steady.settle(sim, [pool("30s")], busy, back=lambda: True)
    assert out is not None and out.at_cost and polls[0] > 20
