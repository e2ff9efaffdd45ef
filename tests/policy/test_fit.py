"""fit: the scheduler filtering spotguard relies on, case by case from the Kubernetes docs."""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.policy import fit
from spotguard.policy.fit import Reason, Usage
from spotguard.policy.tolerations import Toleration
from spotguard.policy.views import NodeView, PodView

from tests.policy.builders import expr, node, node_json, pod, required

ZONE = "topology.kubernetes.io/zone"


def labels_node(**labels: str) -> NodeView:
    return NodeView(name="n1", labels=labels, allocatable={"cpu": 4000, "memory": 2**34, "pods": 10})


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        (expr("a", "In", "x", "y"), {"a": "y"}, True),
        (expr("a", "In", "x"), {"a": "z"}, False),
        (expr("a", "In", "x"), {}, False),
        (expr("a", "NotIn", "x"), {"a": "z"}, True),
        (expr("a", "NotIn", "x"), {"a": "x"}, False),
        (expr("a", "NotIn", "x"), {}, True),  # an absent label is not in the set
        (expr("a", "Exists"), {"a": ""}, True),
        (expr("a", "Exists"), {}, False),
        (expr("a", "DoesNotExist"), {}, True),
        (expr("a", "DoesNotExist"), {"a": "x"}, False),
        (expr("gen", "Gt", "5"), {"gen": "6"}, True),
        (expr("gen", "Gt", "5"), {"gen": "5"}, False),
        (expr("gen", "Gt", "5"), {}, False),
        (expr("gen", "Gt", "5"), {"gen": "six"}, False),
        (expr("gen", "Gt", "five"), {"gen": "6"}, False),
        (expr("gen", "Lt", "5"), {"gen": "4"}, True),
        (expr("gen", "Lt", "5"), {"gen": "-7"}, True),
        (expr("gen", "Lt", "5"), {"gen": "5"}, False),
        (expr("gen", "Gt", "1", "2"), {"gen": "6"}, False),  # Gt takes exactly one value
        (expr("a", "Matches", "x"), {"a": "x"}, False),  # unknown operator
    ],
)
def test_match_requirement(expression: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert fit.match_requirement(expression, labels) is matches


@pytest.mark.parametrize(
    ("field", "matches"),
    [
        ({"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}, True),
        ({"key": "metadata.name", "operator": "In", "values": ["n2"]}, False),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}, True),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}, False),
        ({"key": "metadata.name", "operator": "Exists"}, False),
        ({"key": "metadata.uid", "operator": "In", "values": ["n1"]}, False),
    ],
)
def test_match_fields(field: dict[str, Any], matches: bool) -> None:
    assert fit.match_field(field, labels_node()) is matches


def affinity_pod(terms: list[dict[str, Any]]) -> PodView:
    spec = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    }
    return pod(spec=spec)


@pytest.mark.parametrize(
    ("terms", "matches"),
    [
        ([], False),  # an empty list of terms matches no node
        ([{}], False),  # an empty term matches no node
        ([{"matchExpressions": []}], False),
        ([{"matchExpressions": [expr(ZONE, "In", "a")]}], True),
        # expressions in a term are ANDed
        ([{"matchExpressions": [expr(ZONE, "In", "a"), expr("gpu", "Exists")]}], False),
        # terms are ORed
        (
            [
                {"matchExpressions": [expr("gpu", "Exists")]},
                {"matchExpressions": [expr(ZONE, "In", "a")]},
            ],
            True,
        ),
        # matchFields and matchExpressions in one term are ANDed
        (
            [
                {
                    "matchExpressions": [expr(ZONE, "In", "a")],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}],
                }
            ],
            False,
        ),
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}], True),
    ],
)
def test_required_affinity_terms(terms: list[dict[str, Any]], matches: bool) -> None:
    result = fit.check(affinity_pod(terms), labels_node(**{ZONE: "a"}))
    assert result.ok is matches
    if not matches:
        assert result.reasons == {Reason.NODE_AFFINITY}


def test_no_affinity_matches_every_node() -> None:
    assert fit.check(pod(), labels_node()).ok


def test_ignored_expressions_count_as_satisfied() -> None:
    on_demand = expr("node.kubernetes.io/capacity", "In", "on-demand")
    p = pod(spec=required([on_demand], [on_demand, expr(ZONE, "In", "b")]))
    spot = node("s1", "spot", zone="a")
    assert not fit.check(p, spot).ok

    def ignore(e: Any) -> bool:
        return e == on_demand

    assert fit.check(p, spot, ignore_expression=ignore).ok  # the first term is now empty: all


def test_node_selector() -> None:
    n = labels_node(disk="ssd", **{ZONE: "a"})
    assert fit.check(pod(spec={"nodeSelector": {"disk": "ssd"}}), n).ok
    assert fit.check(pod(spec={"nodeSelector": {"disk": "ssd", ZONE: "a"}}), n).ok
    bad = fit.check(pod(spec={"nodeSelector": {"disk": "hdd"}}), n)
    assert bad.reasons == {Reason.NODE_SELECTOR}
    assert fit.check(pod(spec={"nodeSelector": {"gpu": "yes"}}), n).reasons == {Reason.NODE_SELECTOR}


def test_node_selector_and_affinity_must_both_match() -> None:
    n = labels_node(disk="ssd", **{ZONE: "a"})
    spec = {"nodeSelector": {"disk": "ssd"}} | required([expr(ZONE, "In", "b")])
    assert fit.check(pod(spec=spec), n).reasons == {Reason.NODE_AFFINITY}


@pytest.mark.parametrize(
    ("taint", "tolerations", "ok"),
    [
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, [], False),
        ({"key": "k", "value": "v", "effect": "NoExecute"}, [], False),
        ({"key": "k", "value": "v", "effect": "PreferNoSchedule"}, [], True),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, [{"key": "k", "value": "v"}], True),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            [{"key": "k", "operator": "Equal", "value": "w"}],
            False,
        ),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, [{"key": "k", "operator": "Exists"}], True),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            [{"key": "k", "operator": "Exists", "effect": "NoExecute"}],
            False,
        ),
        ({"key": "k", "effect": "NoExecute"}, [{"operator": "Exists"}], True),  # tolerate all
        ({"key": "k", "effect": "NoExecute"}, [{"operator": "Exists", "effect": "NoExecute"}], True),
        ({"key": "k", "effect": "NoSchedule"}, [{"operator": "Exists", "effect": "NoExecute"}], False),
    ],
)
def test_taints_and_tolerations(taint: dict[str, str], tolerations: list[dict[str, str]], ok: bool) -> None:
    n = node("n1", taints=[taint])
    result = fit.check(pod(spec={"tolerations": tolerations}), n)
    assert result.ok is ok
    if not ok:
        assert result.reasons == {Reason.UNTOLERATED_TAINT}
        assert taint["key"] in str(result)


def test_extra_tolerations_are_added_to_the_pods_own() -> None:
    n = node("n1", taints=[{"key": "spot", "value": "true", "effect": "NoSchedule"}])
    assert not fit.check(pod(), n).ok
    assert fit.check(pod(), n, extra_tolerations=[Toleration("spot", "Exists")]).ok


def test_unschedulable_and_not_ready_nodes() -> None:
    cordoned = node("n1", unschedulable=True)
    assert fit.check(pod(), cordoned).reasons == {Reason.UNSCHEDULABLE}
    tolerate = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert fit.check(pod(spec={"tolerations": [tolerate]}), cordoned).ok
    not_ready = node("n2", ready=False)
    assert fit.check(pod(), not_ready).reasons == {Reason.NOT_READY}
    both = node("n3", ready=False, unschedulable=True)
    assert fit.check(pod(), both).reasons == {Reason.NOT_READY, Reason.UNSCHEDULABLE}
    # the node lifecycle controller's own taint is reported once, as not Ready
    tainted = node("n4", ready=False, taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
    assert [f.reason for f in fit.check(pod(), tainted).failures] == [Reason.NOT_READY]


@pytest.mark.parametrize(
    ("cpu", "memory", "used", "reasons"),
    [
        ("1", "1Gi", Usage(), set()),
        ("4", "16Gi", Usage(), set()),  # exactly full fits
        ("4001m", "1Gi", Usage(), {"Insufficient cpu"}),
        ("1", "17Gi", Usage(), {"Insufficient memory"}),
        ("1", "1Gi", Usage({"cpu": 3500}, 3), {"Insufficient cpu"}),
        ("500m", "1Gi", Usage({"cpu": 3500}, 3), set()),
        ("1", "1Gi", Usage({}, 110), {"Too many pods"}),
        ("5", "20Gi", Usage({}, 110), {"Too many pods", "Insufficient cpu", "Insufficient memory"}),
    ],
)
def test_resources(cpu: str, memory: str, used: Usage, reasons: set[str]) -> None:
    result = fit.check(pod(cpu=cpu, memory=memory), node("n1"), used)
    assert {f.message for f in result.failures} == reasons


def test_pod_without_requests_only_counts_as_a_pod() -> None:
    full = Usage({"cpu": 4000, "memory": 16 * 2**30}, 5)
    assert fit.check(pod(cpu=None, memory=None), node("n1"), full).ok


def test_extended_resource_the_node_lacks() -> None:
    p = pod(spec={"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]})
    assert p.requests == {"nvidia.com/gpu": 1}  # a limit with no request requests the limit
    assert {f.message for f in fit.check(p, node("n1")).failures} == {"Insufficient nvidia.com/gpu"}


def test_node_without_reported_allocatable_is_not_checked_for_resources() -> None:
    raw = node_json("n1")
    raw["status"] = {}
    assert fit.check(pod(cpu="64"), NodeView.from_json(raw)).ok


def test_allocatable_falls_back_to_capacity() -> None:
    raw = node_json("n1")
    raw["status"] = {"capacity": {"cpu": "1", "pods": "2"}}
    assert fit.check(pod(cpu="2"), NodeView.from_json(raw)).reasons == {Reason.INSUFFICIENT_RESOURCE}


def test_effective_requests_include_init_containers_and_overhead() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "3"}}}],
        "overhead": {"cpu": "250m"},
    }
    p = pod(spec=spec)
    assert p.requests["cpu"] == 3250
    assert fit.check(p, node("n1"), Usage({"cpu": 1000}, 1)).reasons == {Reason.INSUFFICIENT_RESOURCE}


def test_usage_by_node_counts_bound_unfinished_pods_including_terminating() -> None:
    pods = [
        pod("a", node_name="n1", cpu="1"),
        pod("b", node_name="n1", cpu="500m"),
        pod("c", node_name="n1", cpu="2", phase="Succeeded"),
        pod("d", node_name="n2", cpu="1", phase="Failed"),
        pod("e", cpu="1"),  # pending: not on a node
        PodView.from_json(
            {
                "metadata": {"name": "f", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n2", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": "Running"},
            }
        ),
    ]
    usage = fit.usage_by_node(pods)
    assert usage["n1"].pods == 2
    assert usage["n1"].requests["cpu"] == 1500
    assert usage["n2"].pods == 1  # the terminating pod still holds its room


def test_check_all_reports_every_node() -> None:
    nodes = [node("a", cpu="1"), node("b", cpu="8"), node("c", unschedulable=True)]
    pods = [pod("x", node_name="a", cpu="800m")]
    fits = fit.check_all(pod(cpu="500m"), nodes, pods)
    assert [(f.node, f.ok) for f in fits] == [("a", False), ("b", True), ("c", False)]
    assert "Insufficient cpu" in str(fits[0])
    assert str(fits[1]) == "fits b"
