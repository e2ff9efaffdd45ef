"""End to end: a slow but healthy API server still gets every pod placed.

GIVEN ``spotguard serve admission`` with default settings (no review deadline of its
own) behind the shipped webhook configuration (3 s timeout), on a cluster labelled as
EKS labels it, WHEN the API server takes 1.1 s for every call (a busy control plane:
slow, never failing), THEN every pod of a scale-up is placed: the review spends the
time the webhook call has (2.55 s of the 3 s) on the calls it needs, rather than
giving each read a fixed second and failing open when one takes longer.
"""

from __future__ import annotations

from pathlib import Path

from spotguard.gateway import resources as r
from spotguard.sim import objects

from tests.admission import harness

LATENCY = 1.1  # seconds for every API call: more than the 1 s a request had before


def test_a_slow_api_server_gets_every_pod_of_a_scale_up_placed(tmp_path: Path) -> None:
    nodes = [
        harness.node("od-0", {"eks.amazonaws.com/capacityType": "ON_DEMAND"}, zone="us-east-1a"),
        harness.node("spot-0", {"eks.amazonaws.com/capacityType": "SPOT"}, zone="us-east-1a"),
        harness.node("spot-1", {"eks.amazonaws.com/capacityType": "SPOT"}, zone="us-east-1b"),
    ]
    scenario = [objects.namespace(n) for n in (harness.NS, "spotguard")] + nodes
    # the default review deadline (unset) and the shipped webhook timeout
    env = {"SPOTGUARD_ADMISSION_DEADLINE_SECONDS": ""}
    with harness.served(scenario, tmp_path, env=env, timeout_seconds=3) as s:
        # GIVEN a running one-replica Deployment, placed while the API was fast
        s.k.create(r.DEPLOYMENTS, harness.deployment("web", 1), harness.NS)
        assert harness.on_demand(s.k, harness.running(s.k, "web", 1)) == (1, 1)
        # WHEN the API server slows to 1.1 s a call and the Deployment is scaled to 6
        s.sim.faults.set(latency_seconds=LATENCY)
        try:
            s.k.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 6}}, harness.NS)
            pods = harness.running(s.k, "web", 6, timeout=180)
        finally:
            s.sim.faults.clear()
        # THEN every new pod was placed (none admitted unpatched) and the floor is exact
        assert harness.on_demand(s.k, pods) == (1, 1)
        assert harness.metric(s.servers[0], "spotguard_admission_requests_total", outcome="failed_open") == 0
