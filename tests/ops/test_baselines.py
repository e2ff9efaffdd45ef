"""The baselines a cost is measured beside (spotguard.ops.baselines)."""

from __future__ import annotations

from spotguard.ops import baselines
from spotguard_sim import nodepools


def test_all_on_demand_limits_every_nodepool_to_on_demand_and_nothing_else() -> None:
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}]}}}}
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
    out = baselines.on_demand_only([pool, other])
    assert out[1] is other
    reqs = nodepools.requirements(out[0])
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]} in reqs
    assert [r for r in reqs if r["key"] == "karpenter.sh/capacity-type"] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]
    assert {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]} in reqs
    # the scenario itself is left as it was
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["spot", "on-demand"]


def test_savings_read_as_cheaper_or_dearer() -> None:
    assert baselines.against(0.6, 1.0) == "40% cheaper than all on-demand"
    assert baselines.against(1.08, 1.0) == "8% dearer than all on-demand"
