"""End to end, default settings, on clusters labelled the way cloud providers label them.

GIVEN a simulated cluster whose nodes carry only one provider's labels (EKS
managed node groups, Karpenter with ``reserved`` capacity, GKE spot pools and
standard pools with no capacity label, AKS spot pools with their taint and
regular pools with no label), or a mix of all of them, and ``spotguard serve
admission`` with no configuration at all behind the shipped webhook
configuration, WHEN Deployments and StatefulSets are created, THEN every pod is
Running and each workload has exactly its floor on on-demand nodes (by the
node's labels) and the rest on spot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects

from tests.admission import harness

AKS_SPOT_TAINT = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}
SCHEMES: dict[str, tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]] | None]] = {
    # name: (on-demand node labels, spot node labels, taints of the spot nodes)
    "eks": ([{"eks.amazonaws.com/capacityType": "ON_DEMAND"}], [{"eks.amazonaws.com/capacityType": "SPOT"}], None),
    "karpenter": (
        [{"karpenter.sh/capacity-type": "on-demand"}, {"karpenter.sh/capacity-type": "reserved"}],
        [{"karpenter.sh/capacity-type": "spot"}],
        None,
    ),
    "karpenter-reserved-only": (
        [{"karpenter.sh/capacity-type": "reserved"}],
        [{"karpenter.sh/capacity-type": "spot"}],
        None,
    ),
    "gke": ([{"cloud.google.com/gke-nodepool": "default-pool"}], [{"cloud.google.com/gke-spot": "true"}], None),
    "aks": (
        [{"kubernetes.azure.com/agentpool": "regular"}],
        [{"kubernetes.azure.com/scalesetpriority": "spot"}],
        [AKS_SPOT_TAINT],
    ),
}


def _nodes(scheme: str, prefix: str = "") -> list[dict[str, Any]]:
    od_labels, spot_labels, spot_taints = SCHEMES[scheme]
    out = []
    for i in range(2):
        out.append(harness.node(f"{prefix}od-{i}", dict(od_labels[i % len(od_labels)]), zone=f"us-east-1{'ab'[i]}"))
    for i in range(3):
        out.append(
            harness.node(f"{prefix}spot-{i}", dict(spot_labels[0]), zone=f"us-east-1{'abc'[i]}", taints=spot_taints)
        )
    return out


def _scenario(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [objects.namespace(n) for n in (harness.NS, "spotguard")] + nodes


@pytest.fixture(scope="module", params=[*SCHEMES, "mixed"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, harness.Served]]:
    scheme = str(request.param)
    if scheme == "mixed":
        nodes = [n for s in ("eks", "gke", "aks", "karpenter") for n in _nodes(s, prefix=f"{s}-")]
    else:
        nodes = _nodes(scheme)
    with harness.served(_scenario(nodes), tmp_path_factory.mktemp(f"providers-{scheme}")) as s:
        yield scheme, s


@pytest.mark.parametrize(("replicas", "floor"), [(1, 1), (6, 1)])
def test_deployments_run_with_exactly_their_floor_on_on_demand(
    cluster: tuple[str, harness.Served], replicas: int, floor: int
) -> None:
    scheme, s = cluster
    name = f"web-{replicas}"
    s.k.create(r.DEPLOYMENTS, harness.deployment(name, replicas), harness.NS)
    pods = harness.running(s.k, name, replicas)
    assert harness.on_demand(s.k, pods) == (floor, floor), scheme


def test_a_statefulset_keeps_its_quorum_on_on_demand(cluster: tuple[str, harness.Served]) -> None:
    scheme, s = cluster
    s.k.create(r.STATEFULSETS, harness.statefulset("db", 5), harness.NS)
    pods = harness.running(s.k, "db", 5)
    assert harness.on_demand(s.k, pods) == (3, 3), scheme
    caps = harness.capacities(s.k)
    quorum = {p["metadata"]["name"] for p in pods if caps[p["spec"]["nodeName"]] is Capacity.ON_DEMAND}
    assert quorum == {"db-0", "db-1", "db-2"}


def test_the_webhook_is_ready_on_every_scheme(cluster: tuple[str, harness.Served]) -> None:
    _, s = cluster
    import requests

    answer = requests.get(s.servers[0].url + "/readyz", verify=s.servers[0].ca, timeout=5)
    assert (answer.status_code, answer.text) == (200, "ok")
