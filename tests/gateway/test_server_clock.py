"""The API server's clock, read from its answers' Date headers (spotguard.gateway.serverclock)."""

from __future__ import annotations

import email.utils

from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.gateway.serverclock import ServerClock
from spotguard_sim import testing

from tests.interruption import sim_scenario


def test_the_offset_is_what_the_last_date_header_showed() -> None:
    local = [1_000_000.0]
    clock = ServerClock(lambda: local[0])
    assert clock.now() == 1_000_000.0 and not clock.seen  # nothing seen: the local time
    clock.observe(email.utils.formatdate(1_000_600.0, usegmt=True))  # a server 10 minutes ahead
    assert clock.seen and abs(clock.now() - 1_000_600.5) < 1e-6
    local[0] += 30
    assert abs(clock.now() - 1_000_630.5) < 1e-6
    for bad in (None, "", "yesterday", "Mon, 99 Foo 2026 25:61:00 GMT"):
        clock.observe(bad)  # ignored, the offset stands
    assert abs(clock.offset - 600.5) < 1e-6


def test_a_kube_reads_the_simulated_clusters_clock_not_its_own() -> None:
    # GIVEN a simulated cluster whose clock runs 20 times faster than this process's
    with testing.running_cluster([sim_scenario.namespace("shop")], time_scale=20) as sim:
        sim.clock.sleep(100)  # 5 real seconds: the cluster's clock is 95 s ahead of this process's
        k = kube.Kube(sim.api_client())
        k.list(r.NAMESPACES)
        # THEN its time is the cluster's (to the header's second), not the local one
        assert abs(k.server_now() - sim.clock.now()) < 2.0
        assert k.server_clock.offset > 60
        # AND a Kube with another retry policy shares it
        assert k.with_policy(k.policy).server_clock is k.server_clock
