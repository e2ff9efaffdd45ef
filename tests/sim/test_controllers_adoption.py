"""Adoption by label selector (pkg/controller/controller_ref_manager.go, ``claimObject``),
and the surge copy of issue 24 beside it: a ReplicaSet of spotguard's that no
controller adopts and no other writer of the Deployment undoes. Driven with the
official kubernetes client."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from spotguard.policy import config, surgecopy
from spotguard.policy.workloads import SURGE_OF, surge_deployment
from spotguard_sim import testing

from tests.sim import controller_helpers as h

SCALE = 50.0


@pytest.fixture
def sim() -> Iterator[Any]:
    with testing.running_cluster(time_scale=SCALE, ready_delay_seconds=1.0, termination_seconds=1.0) as cluster:
        for i in range(3):
            cluster.store.create("nodes", h.node(f"n{i}", zone="abc"[i]))
        yield cluster


def apps(sim: Any) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(sim.api_client())


def controller_of(obj: dict[str, Any]) -> tuple[str, str] | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref["kind"], ref["name"]
    return None


def copy_pods(sim: Any, ready: bool = True) -> list[dict[str, Any]]:
    pods = h.ready_pods(sim.store, "web") if ready else h.pods_of(sim.store, "web")
    return [
        p for p in pods
        if surge_deployment(p["metadata"].get("labels") or {}, p["metadata"].get("annotations") or {}) == "web"
    ]


def own_pods(sim: Any) -> list[dict[str, Any]]:
    return [p for p in h.ready_pods(sim.store, "web") if SURGE_OF not in p["metadata"]["labels"]]


def test_a_deployment_adopts_an_orphan_replicaset_whose_own_labels_match_its_selector(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("web", 2))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2, what="2 ready")
    stray = h.replicaset("stray", 1)
    stray["metadata"]["labels"] = {"app": "web"}  # its own labels: what ClaimReplicaSets matches
    stray["spec"]["selector"] = {"matchLabels": {"app": "web", "stray": "yes"}}
    stray["spec"]["template"]["metadata"]["labels"] = {"app": "web", "stray": "yes"}
    api.create_namespaced_replica_set("default", stray)
    h.wait_for(
        lambda: controller_of(sim.store.get("replicasets", "stray", "default")) == ("Deployment", "web"),
        what="the orphan adopted",
    )


def test_the_surge_copy_is_adopted_by_nobody_and_outlives_every_writer_of_the_deployment(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("web", 4))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 4, what="4 ready")
    dep = sim.store.get("deployments", "web", "default")
    body = surgecopy.build(dep, 2, config.Config(), events=("e-1",))
    assert not isinstance(body, surgecopy.Refusal)
    api.create_namespaced_replica_set("default", body)
    h.wait_for(lambda: len(copy_pods(sim)) == 2 and len(own_pods(sim)) == 4, what="4 + 2 ready")
    for p in copy_pods(sim):
        assert controller_of(p) == ("ReplicaSet", "spotguard-surge-web")

    # A GitOps revert or an HPA writing the Deployment's count: the copy is not touched.
    api.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 3}})
    h.wait_for(lambda: len(h.pods_of(sim.store, "web")) == 5, what="3 + 2")
    assert len(copy_pods(sim)) == 2
    h.wait_for(lambda: api.read_namespaced_deployment("web", "default").status.replicas == 3, what="status: 3")

    # kubectl replace (Argo CD Replace=true, helm --force): the manifest as it is in Git.
    manifest = h.deployment("web", 4)
    api.replace_namespaced_deployment("web", "default", copy.deepcopy(manifest))
    h.wait_for(lambda: len(own_pods(sim)) == 4, what="4 of the Deployment's own")
    assert len(copy_pods(sim)) == 2

    # kubectl replace --force (Argo CD Replace=true,Force=true): delete and create again; the
    # garbage collector takes the Deployment's pods, the copy's keep serving meanwhile.
    api.delete_namespaced_deployment("web", "default", propagation_policy="Background")
    h.wait_for(lambda: not own_pods(sim), what="the Deployment's pods gone")
    assert len(copy_pods(sim)) == 2
    api.create_namespaced_deployment("default", copy.deepcopy(manifest))
    h.wait_for(lambda: len(own_pods(sim)) == 4, what="4 again")
    assert len(copy_pods(sim)) == 2

    rs = sim.store.get("replicasets", "spotguard-surge-web", "default")
    assert controller_of(rs) is None and rs["spec"]["replicas"] == 2
    mine = {r["metadata"]["name"] for r in sim.store.list("replicasets", namespace="default")[0] if controller_of(r)}
    assert "spotguard-surge-web" not in mine
