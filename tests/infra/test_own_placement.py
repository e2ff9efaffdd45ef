"""Where spotguard's own pods run: on on-demand nodes, under every provider's labels.

The webhook and the queue processor must not run on the spot nodes being reclaimed in
the very event they handle. GIVEN the rendered Helm chart, kustomize and Knative
manifests, THEN each of spotguard's Deployments and Knative Services prefers "not spot
under any label scheme" (the expressions of the admission patch's own on-demand
requirement), and WHEN the Deployments are
created on a simulated cluster labelled as EKS managed node groups or Karpenter label
nodes (on-demand nodes small, spot nodes large and empty, so every other score favours
spot), THEN every one of their pods runs on an on-demand node.
"""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config, patches
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects, testing

from tests.admission import harness
from tests.infra.test_manifests import INFRA, helm, knative_services, knative_with_node_added, kustomize, of_kind

DEFAULTS = config.Config()
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
PROVIDERS = {
    "eks": ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, {"eks.amazonaws.com/capacityType": "SPOT"}),
    "karpenter": ({"karpenter.sh/capacity-type": "on-demand"}, {"karpenter.sh/capacity-type": "spot"}),
}


def _deployments(source: str) -> list[dict[str, Any]]:
    if source == "helm":
        return of_kind(helm(), "Deployment")
    rendered = [*kustomize("kubernetes/base"), *kustomize("kubernetes/spot-interruption")]
    return of_kind(rendered, "Deployment")


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_own_pods_prefer_not_spot_under_every_scheme(source: str) -> None:
    deployments = _deployments(source)
    assert {d["metadata"]["name"] for d in deployments} >= {"spotguard-admission", "spotguard-node-added"}
    for d in deployments:
        preferred = d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][PREFERRED]
        assert [p["preference"]["matchExpressions"] for p in preferred] == [
            patches.not_spot_expressions(DEFAULTS)
        ], d["metadata"]["name"]


def test_knative_services_prefer_not_spot_under_every_scheme() -> None:
    # GIVEN infra/knative rendered (its node-added component too; infra/check validates
    # the same renderings against the Knative CRD schemas), THEN each Knative Service's
    # revisions prefer "not spot under any label scheme", as the Deployments do
    services = knative_services(knative_with_node_added())
    assert set(services) == {"spotguard-admission", "spotguard-spot-interruption", "spotguard-node-added"}
    for name, svc in services.items():
        preferred = svc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][PREFERRED]
        assert [p["preference"]["matchExpressions"] for p in preferred] == [
            patches.not_spot_expressions(DEFAULTS)
        ], name
    # ... and the manifests say, where they are applied, that Knative Serving must allow
    # affinity (its kubernetes.podspec-affinity flag), or it rejects every one of them
    assert "kubernetes.podspec-affinity" in (INFRA / "knative" / "kustomization.yaml").read_text()


def _node(name: str, labels: dict[str, str], zone: str, cpu: str) -> dict[str, Any]:
    return objects.node(name, None, zone=zone, labels=labels, cpu=cpu, memory="256Gi", pods="110")


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_own_pods_run_on_on_demand_nodes(provider: str, source: str) -> None:
    # GIVEN a cluster labelled only as the provider labels it: two small on-demand nodes
    # and four large spot nodes in two zones
    od, spot = PROVIDERS[provider]
    nodes = [_node(f"od-{i}", dict(od), f"us-east-1{'ab'[i]}", "4") for i in range(2)]
    nodes += [_node(f"spot-{i}", dict(spot), f"us-east-1{'ab'[i % 2]}", "64") for i in range(4)]
    deployments = _deployments(source)
    accounts = sorted({str(d["spec"]["template"]["spec"].get("serviceAccountName") or "default") for d in deployments})
    scenario = [objects.namespace("spotguard"), *nodes]
    scenario += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": a, "namespace": "spotguard"}}
                 for a in accounts]
    with testing.running_cluster(scenario, termination_seconds=0.2) as sim:
        k = kube.Kube(sim.api_client())
        # WHEN spotguard's Deployments are created
        expected = 0
        for d in deployments:
            k.create(r.DEPLOYMENTS, d, "spotguard")
            expected += int(d["spec"].get("replicas") or 1)
        # THEN every pod is scheduled onto an on-demand node
        caps = {n["metadata"]["name"]: DEFAULTS.node_capacity(n["metadata"]["labels"]) for n in nodes}

        def placed() -> list[dict[str, Any]]:
            return [p for p in k.list(r.PODS, "spotguard") if p["spec"].get("nodeName")]

        harness.wait_for(lambda: len(placed()) >= expected, 60, f"{expected} scheduled pods")
        where = {p["metadata"]["name"]: caps[p["spec"]["nodeName"]] for p in placed()}
        assert set(where.values()) == {Capacity.ON_DEMAND}, where
