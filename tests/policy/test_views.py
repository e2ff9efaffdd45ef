"""Views of pods and nodes, quantities and effective requests, tolerations parsing."""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.policy import quantities, tolerations
from spotguard.policy.tolerations import Taint, Toleration
from spotguard.policy.views import NodeView, PodView

from tests.policy.builders import node_json, pod_json, required


@pytest.mark.parametrize(
    ("text", "milli", "expected"),
    [
        ("100m", True, 100),
        ("1", True, 1000),
        ("1.5", True, 1500),
        ("0.1", True, 100),
        ("1Gi", False, 2**30),
        ("128Mi", False, 128 * 2**20),
        ("1G", False, 10**9),
        ("1e3", False, 1000),
        ("1k", False, 1000),
        ("500n", True, 1),  # rounded up
        ("110", False, 110),
    ],
)
def test_quantities(text: str, milli: bool, expected: int) -> None:
    assert quantities.parse(text, milli=milli) == expected


@pytest.mark.parametrize("text", ["", "abc", "1Zi", "1.2.3", "--1"])
def test_invalid_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        quantities.parse(text)


def test_unparseable_resources_are_dropped() -> None:
    assert quantities.parse_resources({"cpu": "1", "memory": "lots"}) == {"cpu": 1000}


def c(name: str, cpu: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": {"cpu": cpu}}, **extra}


@pytest.mark.parametrize(
    ("spec", "cpu"),
    [
        ({"containers": [c("a", "1"), c("b", "500m")]}, 1500),
        ({"containers": [c("a", "1")], "initContainers": [c("i", "2")]}, 2000),
        ({"containers": [c("a", "1")], "initContainers": [c("i", "500m")]}, 1000),
        # a sidecar runs alongside the containers and the init containers after it
        (
            {"containers": [c("a", "1")], "initContainers": [c("s", "1", restartPolicy="Always"), c("i", "1500m")]},
            2500,
        ),
        ({"containers": [c("a", "1")], "overhead": {"cpu": "250m"}}, 1250),
        ({"containers": [{"name": "a", "resources": {"limits": {"cpu": "2"}}}]}, 2000),  # limit as request
        (
            {"containers": [{"name": "a", "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}}}]},
            1000,
        ),
        ({"containers": [c("a", "1"), c("b", "1")], "resources": {"requests": {"cpu": "1500m"}}}, 1500),  # pod-level
        ({"containers": [{"name": "a"}]}, 0),
    ],
)
def test_effective_requests(spec: dict[str, Any], cpu: int) -> None:
    assert quantities.pod_requests(spec).get("cpu", 0) == cpu


def test_node_view() -> None:
    raw = node_json("n1", "spot", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    raw["spec"]["providerID"] = "aws:///eu-west-1a/i-0abc123"
    n = NodeView.from_json(raw)
    assert n.instance_id == "i-0abc123"
    assert n.taints == (Taint("k", "v", "NoSchedule"),)
    assert n.allocatable == {"cpu": 4000, "memory": 16 * 2**30, "pods": 110}
    assert n.ready and not n.unschedulable
    assert NodeView(name="x", provider_id="gce://p/z/x").instance_id == ""
    assert not NodeView.from_json(node_json("n2", ready=False)).ready
    assert NodeView.from_json({"metadata": {"name": "bare"}}).ready  # no conditions reported yet


def test_pod_view() -> None:
    p = PodView.from_json(pod_json("db-3", owner=("StatefulSet", "db"), node_name="n1", spec=required([])))
    assert p.owner is not None and p.owner.kind == "StatefulSet"
    assert p.ordinal == 3 and p.ready and p.active and p.phase == "Running"
    assert p.required_terms == ({"matchExpressions": []},) and p.has_required_affinity
    empty = pod_json()
    empty["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    }
    e = PodView.from_json(empty)
    assert e.required_terms == () and e.has_required_affinity
    assert not PodView.from_json(pod_json()).has_required_affinity
    minimal = PodView.from_json({})
    assert (minimal.name, minimal.owner, minimal.phase, minimal.labels) == ("", None, "Pending", {})
    gone = pod_json(node_name="n1")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not PodView.from_json(gone).active


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spot=true:NoSchedule", Toleration("spot", "Equal", "true", "NoSchedule")),
        ("spot:NoExecute", Toleration("spot", "Exists", "", "NoExecute")),
        ("spot", Toleration("spot", "Exists")),
        ("spot=", Toleration("spot", "Equal", "")),
    ],
)
def test_parse_toleration(text: str, expected: Toleration) -> None:
    assert tolerations.parse_toleration(text) == expected
    assert Toleration.from_json(expected.to_json()) == expected


def test_untolerated() -> None:
    taints = [Taint("a", "", "NoSchedule"), Taint("b", "", "PreferNoSchedule"), Taint("c", "x", "NoExecute")]
    left = tolerations.untolerated(taints, [Toleration("c", "Equal", "x")], ["NoSchedule", "NoExecute"])
    assert left == [Taint("a", "", "NoSchedule")]
