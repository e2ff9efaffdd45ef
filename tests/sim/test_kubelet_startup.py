"""A pod never starts sooner than the ready delay after it is bound, however often the kubelet resyncs.

Found by the demo: the kubelet's periodic resync (every 30 simulated seconds) started
any pending bound pod at once, so a 200 s startup became at most 30 s (kinder than a
real cluster: replacements Ready before a two-minute notice ran out).
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import pods, testing

from tests.sim import controller_helpers as h

SCALE = 100.0
DELAY = 150.0  # five kubelet resyncs


def test_a_slow_pod_waits_its_whole_startup_through_resyncs() -> None:
    with testing.running_cluster(time_scale=SCALE, ready_delay_seconds=DELAY) as sim:
        sim.store.create("nodes", h.node("n1"))
        sim.store.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
            },
        )
        pod = h.wait_for(lambda: _if_ready(sim.store.get("pods", "p", "default")), timeout=30, what="ready")
        # The pod's own record, not a clock read by an observer: the scheduler stamps
        # PodScheduled=True when it binds (before the write), the kubelet stamps Ready and
        # startTime when it starts the pod (after its wait). A subscriber reading the clock
        # on each notification measured the bind late whenever the binding thread was
        # descheduled between the kubelet's notification and its own (149.94 s for 150 s
        # under load). Both stamps are whole seconds rounded down: with the start really
        # DELAY or more after the bind, the stamps differ by more than DELAY - 1, so by
        # DELAY or more (DELAY is whole); the resync defect started pods 30 s or more early.
        bound = _transition(pod, "PodScheduled")
        ready = _transition(pod, "Ready")
        started = simclock.parse_iso(pod["status"]["startTime"])
        assert ready == started
        assert ready - bound >= DELAY


def _if_ready(pod: dict[str, Any]) -> dict[str, Any] | None:
    return pod if h.is_ready(pod) else None


def _transition(pod: dict[str, Any], kind: str) -> float:
    """When the pod's ``kind`` condition last changed (it must be True)."""
    cond = pods.condition(pod, kind)
    assert cond is not None and cond.get("status") == "True", (kind, cond)
    return simclock.parse_iso(cond["lastTransitionTime"])
