"""The defaults table of DESIGN.md and every form of the min-on-demand annotation."""

from __future__ import annotations

import dataclasses

import pytest
from spotguard.policy import config, floors
from spotguard.policy.floors import Count, Percent
from spotguard.policy.validation import Problem
from spotguard.policy.workloads import MIN_ON_DEMAND, SURGE, Kind, Workload

CFG = config.Config()


def wl(kind: Kind, replicas: int, namespace: str = "shop", **annotations: str) -> Workload:
    return Workload(kind=kind, namespace=namespace, name="w", replicas=replicas, annotations=annotations)


@pytest.mark.parametrize(
    ("kind", "replicas", "expected"),
    [
        (Kind.DEPLOYMENT, 0, 0),
        (Kind.DEPLOYMENT, 1, 1),
        (Kind.DEPLOYMENT, 2, 1),
        (Kind.DEPLOYMENT, 10, 1),
        (Kind.DEPLOYMENT, 60, 1),
        (Kind.STATEFULSET, 0, 0),
        (Kind.STATEFULSET, 1, 1),
        (Kind.STATEFULSET, 2, 2),
        (Kind.STATEFULSET, 3, 2),
        (Kind.STATEFULSET, 4, 3),
        (Kind.STATEFULSET, 5, 3),
        (Kind.STATEFULSET, 7, 4),
    ],
)
def test_default_floor_table(kind: Kind, replicas: int, expected: int) -> None:
    got = floors.floor_for(wl(kind, replicas), CFG)
    assert (got.enabled, got.on_demand, got.source) == (True, expected, "default")


@pytest.mark.parametrize(
    ("value", "replicas", "expected"),
    [
        ("3", 10, 3),
        ("0", 10, 0),
        ("30%", 10, 3),
        ("31%", 10, 4),  # rounds up
        ("1%", 10, 1),
        ("100%", 7, 7),
        ("0%", 7, 0),
        ("15", 4, 4),  # clamped to replicas
        (" 2 ", 5, 2),  # whitespace tolerated
        ("50%", 1, 1),
    ],
)
def test_annotation_forms(value: str, replicas: int, expected: int) -> None:
    got = floors.floor_for(wl(Kind.DEPLOYMENT, replicas, **{"spotguard.io/min-on-demand": value}), CFG)
    assert (got.on_demand, got.source, got.problems) == (expected, "annotation", ())


@pytest.mark.parametrize("value", ["-1", "abc", "3.5", "150%", "", "%", "1e3", "10 %", "two"])
def test_invalid_annotation_reports_and_uses_default(value: str) -> None:
    got = floors.floor_for(wl(Kind.STATEFULSET, 5, **{"spotguard.io/min-on-demand": value}), CFG)
    assert got.on_demand == 3
    assert got.source == "default"
    assert len(got.problems) == 1
    assert got.problems[0].field == "spotguard.io/min-on-demand"
    assert got.problems[0].value == value


def test_parse_min_on_demand_types() -> None:
    assert floors.parse_min_on_demand("4") == Count(4)
    assert floors.parse_min_on_demand("25%") == Percent(25)
    assert isinstance(floors.parse_min_on_demand("x"), Problem)


@pytest.mark.parametrize(
    ("wl_value", "ns_value", "enabled"),
    [
        (None, None, True),
        ("false", None, False),
        (None, "false", False),
        ("FALSE", None, False),
        ("true", None, True),
        ("true", "false", False),
    ],
)
def test_opt_out(wl_value: str | None, ns_value: str | None, enabled: bool) -> None:
    ann = {} if wl_value is None else {"spotguard.io/enabled": wl_value}
    ns = {} if ns_value is None else {"spotguard.io/enabled": ns_value}
    got = floors.floor_for(wl(Kind.DEPLOYMENT, 3, **ann), CFG, namespace_annotations=ns)
    assert got.enabled is enabled
    assert got.on_demand == (1 if enabled else 0)


def test_invalid_enabled_value_is_reported_and_stays_enabled() -> None:
    got = floors.floor_for(wl(Kind.DEPLOYMENT, 3, **{"spotguard.io/enabled": "nope"}), CFG)
    assert got.enabled and len(got.problems) == 1


def test_excluded_namespace_is_disabled() -> None:
    assert not floors.floor_for(wl(Kind.DEPLOYMENT, 3, namespace="kube-system"), CFG).enabled


def test_cluster_default_from_config() -> None:
    cfg, problems = config.from_env({"SPOTGUARD_DEFAULT_MIN_ON_DEMAND": "50%"})
    assert problems == []
    got = floors.floor_for(wl(Kind.DEPLOYMENT, 5), cfg)
    assert (got.on_demand, got.source) == (3, "config")
    # the annotation still wins over the cluster default
    got = floors.floor_for(wl(Kind.DEPLOYMENT, 5, **{"spotguard.io/min-on-demand": "0"}), cfg)
    assert (got.on_demand, got.source) == (0, "annotation")


def test_a_percentage_floor_does_not_rise_with_the_surge_itself() -> None:
    """50 % of 4 is 2; surged by 2 to 6, the floor is 2 + 2, not 50 % of 6 + 2: the surge's
    two extras are its own on-demand slots, and no extra slot with a deletion cost appears
    (a rebalance-only scale back then removed a spot pod of a living node: tests/chaos)."""
    record = '{"replicas":4,"surge":2,"written":6,"events":["e"],"nodes":["spot-1"],"started":1}'
    wl = Workload(Kind.DEPLOYMENT, "shop", "cart", 6, {MIN_ON_DEMAND: "50%", SURGE: record})
    floor = floors.floor_for(wl, config.Config())
    assert (floor.on_demand, floor.surge) == (4, 2)
    # a person scaled to 10 during the surge (the owner now wants 8): 50 % of 8 + 2
    assert floors.floor_for(dataclasses.replace(wl, replicas=10), config.Config()).on_demand == 6
    # a GitOps revert to 4: the owner wants 4; 2 + the surge, capped at the replicas
    assert floors.floor_for(dataclasses.replace(wl, replicas=4), config.Config()).on_demand == 4


def test_a_copys_surge_does_not_raise_the_deployments_floor() -> None:
    """A surge by a copy (``"copy": true``) leaves the owner's floor as without a surge: the
    copy's own pods (pinned on-demand by its template) are the surge's replicas, and the
    Deployment's replacements fill its usual floor, spot preferred."""
    record = '{"replicas":6,"surge":2,"written":6,"events":["e"],"nodes":["spot-1"],"started":1,"copy":true}'
    wl = Workload(Kind.DEPLOYMENT, "shop", "cart", 6, {MIN_ON_DEMAND: "50%", SURGE: record})
    floor = floors.floor_for(wl, config.Config())
    assert (floor.on_demand, floor.surge) == (3, 0)
    # lowered by a GitOps revert or a replace during the surge: the floor of the owner's count
    assert floors.floor_for(dataclasses.replace(wl, replicas=4), config.Config()).on_demand == 2
