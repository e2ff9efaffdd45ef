"""Configuration from environment variables and from a ConfigMap: every setting, and bad values."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from spotguard.policy import capacity, config
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config, RebalanceAction
from spotguard.policy.floors import Count, Percent
from spotguard.policy.headroom import Cover
from spotguard.policy.tolerations import Toleration

# (field, raw value, expected parsed value)
VALID: list[tuple[str, str, Any]] = [
    (
        "label_schemes",
        "karpenter.sh/capacity-type=spot:on-demand",
        (capacity.scheme("karpenter.sh/capacity-type", ["spot"], ["on-demand"]),),
    ),
    ("affinity_label", " karpenter.sh/capacity-type ", "karpenter.sh/capacity-type"),
    ("excluded_namespaces", "kube-system, monitoring,,", frozenset({"kube-system", "monitoring"})),
    ("excluded_namespaces", "", frozenset()),
    ("default_min_on_demand", "2", Count(2)),
    ("default_min_on_demand", "50%", Percent(50)),
    (
        "spot_tolerations",
        "spot=true:NoSchedule, capacity:NoExecute,dedicated",
        (
            Toleration("spot", "Equal", "true", "NoSchedule"),
            Toleration("capacity", "Exists", "", "NoExecute"),
            Toleration("dedicated", "Exists"),
        ),
    ),
    ("unknown_capacity", "spot", Capacity.SPOT),
    ("unknown_capacity", " on-demand ", Capacity.ON_DEMAND),
    ("rebalance_action", "Surge", RebalanceAction.SURGE),
    ("rebalance_action", "ignore", RebalanceAction.IGNORE),
    ("rebalance_action", "taint", RebalanceAction.TAINT),
    ("spread_topology_keys", "topology.kubernetes.io/zone", ("topology.kubernetes.io/zone",)),
    ("spread_topology_keys", "", ()),
    ("spot_preference_weight", "50", 50),
    ("spot_preference_weight", "500", 100),  # clamped to the API's 1..100
    ("spot_preference_weight", "0", 1),
    ("on_demand_deletion_cost", "5000", 5000),
    ("on_demand_deletion_cost", "0", 0),
    ("reservation_ttl_seconds", "45", 45),
    ("rebalance_max_workloads_per_step", "3", 3),
    ("rebalance_max_pods_per_workload", "2", 2),
    ("rebalance_max_in_flight", "500", 500),
    ("rebalance_move_timeout_seconds", "120", 120),
    ("rebalance_hold_seconds", "60", 60),
    ("rebalance_settle_seconds", "0", 0),
    ("rebalance_surge_seconds", "300", 300),
    ("drain", "true", True),
    ("drain", " False ", False),
    ("surge_copy", "true", True),
    ("on_demand_launchable", "auto", config.Launchable.AUTO),
    ("on_demand_launchable", " True", config.Launchable.TRUE),
    ("on_demand_launchable", "false", config.Launchable.FALSE),
    ("headroom", "largest-node", Cover.LARGEST_NODE),
    ("headroom", " All-Spot ", Cover.ALL_SPOT),
    ("headroom", "off", Cover.OFF),
    ("headroom_max_pods", "4", 4),
    ("headroom_image", " registry.example.com/pause:3.10 ", "registry.example.com/pause:3.10"),
]

INVALID: list[tuple[str, str]] = [
    ("label_schemes", "karpenter.sh/capacity-type"),
    ("label_schemes", ""),
    ("default_min_on_demand", "half"),
    ("default_min_on_demand", "120%"),
    ("spot_tolerations", "spot=true:Sometimes"),
    ("spot_tolerations", "=x"),
    ("unknown_capacity", "unknown"),
    ("unknown_capacity", "maybe"),
    ("rebalance_action", "drain"),
    ("spot_preference_weight", "heavy"),
    ("on_demand_deletion_cost", "1.5"),
    ("reservation_ttl_seconds", "-1"),
    ("reservation_ttl_seconds", "30s"),
    ("rebalance_max_workloads_per_step", "-2"),
    ("rebalance_max_pods_per_workload", "many"),
    ("rebalance_max_in_flight", "-1"),
    ("rebalance_hold_seconds", "-1"),
    ("rebalance_move_timeout_seconds", "5m"),
    ("rebalance_settle_seconds", "-3"),
    ("rebalance_surge_seconds", "-5"),
    ("drain", "sometimes"),
    ("surge_copy", "copy"),
    ("on_demand_launchable", "sometimes"),
    ("headroom", "everything"),
    ("headroom_max_pods", "-1"),
    ("headroom_image", "pause 3.10"),
]


def test_every_setting_is_covered() -> None:
    assert {f for f, _, _ in VALID} == set(config.SETTINGS)
    assert {f for f, _ in INVALID} == set(config.SETTINGS) - {
        "excluded_namespaces",
        "spread_topology_keys",
        "affinity_label",  # deprecated and ignored: any text is accepted
    }  # any text is a valid list


def test_defaults() -> None:
    cfg = Config()
    assert cfg.label_schemes == capacity.DEFAULT_SCHEMES
    assert cfg.affinity_label == ""  # deprecated: the patch covers every scheme
    assert {t.key for t in cfg.spot_tolerations} == {
        "kubernetes.azure.com/scalesetpriority",
        "cloud.google.com/gke-spot",
        "cloud.google.com/gke-preemptible",
    }
    assert "kube-system" in cfg.excluded_namespaces
    assert cfg.default_min_on_demand is None
    assert cfg.unknown_capacity is Capacity.ON_DEMAND
    assert cfg.rebalance_action is RebalanceAction.TAINT
    assert cfg.headroom is Cover.OFF and cfg.headroom_max_pods == 10  # headroom is billed: opt in
    assert config.from_env({}) == (cfg, [])
    assert config.from_configmap({}) == (cfg, [])


@pytest.mark.parametrize(("field", "raw", "expected"), VALID)
def test_valid_from_env(field: str, raw: str, expected: Any) -> None:
    cfg, problems = config.from_env({"SPOTGUARD_" + field.upper(): raw})
    assert problems == []
    assert getattr(cfg, field) == expected


@pytest.mark.parametrize(("field", "raw", "expected"), VALID)
def test_valid_from_configmap(field: str, raw: str, expected: Any) -> None:
    cfg, problems = config.from_configmap({field.replace("_", "-"): raw})
    assert problems == []
    assert getattr(cfg, field) == expected


@pytest.mark.parametrize(("field", "raw"), INVALID)
def test_invalid_values_give_a_problem_and_the_default(field: str, raw: str) -> None:
    for cfg, problems in (
        config.from_env({config.env_name(field): raw}),
        config.from_configmap({config.configmap_key(field): raw}),
    ):
        assert [(p.field, p.value) for p in problems] == [(field, raw)]
        assert "default" in problems[0].message or "using" in problems[0].message
        assert getattr(cfg, field) == getattr(Config(), field)
        assert str(problems[0]).startswith(f"{field}=")


def test_names() -> None:
    assert config.env_name("excluded_namespaces") == "SPOTGUARD_EXCLUDED_NAMESPACES"
    assert config.configmap_key("excluded_namespaces") == "excluded-namespaces"


def test_one_bad_value_does_not_spoil_the_others() -> None:
    cfg, problems = config.from_configmap({"rebalance-action": "explode", "unknown-capacity": "spot", "unrelated": "x"})
    assert [p.field for p in problems] == ["rebalance_action"]
    assert cfg.unknown_capacity is Capacity.SPOT
    assert cfg.rebalance_action is RebalanceAction.TAINT


def test_env_ignores_other_variables_and_configmap_keys_in_env_form() -> None:
    cfg, problems = config.from_env({"PATH": "/bin", "excluded-namespaces": "x"})
    assert (cfg, problems) == (Config(), [])
    cfg, problems = config.from_configmap({"SPOTGUARD_EXCLUDED_NAMESPACES": "x"})
    assert (cfg, problems) == (Config(), [])


def test_the_deprecated_affinity_label_is_accepted_and_changes_nothing() -> None:
    cfg, problems = config.from_env({"SPOTGUARD_AFFINITY_LABEL": "node.kubernetes.io/capacity"})
    assert problems == []
    assert dataclasses.replace(cfg, affinity_label="") == Config()


def test_configmap_over_env_base() -> None:
    env_cfg, _ = config.from_env({"SPOTGUARD_UNKNOWN_CAPACITY": "spot"})
    cfg, _ = config.from_configmap({"rebalance-action": "surge"}, base=env_cfg)
    assert (cfg.unknown_capacity, cfg.rebalance_action) == (Capacity.SPOT, RebalanceAction.SURGE)


def test_node_capacity_maps_unknown_to_the_setting() -> None:
    assert Config().node_capacity({}) is Capacity.ON_DEMAND
    spot_cfg, _ = config.from_env({"SPOTGUARD_UNKNOWN_CAPACITY": "spot"})
    assert spot_cfg.node_capacity({}) is Capacity.SPOT
    assert spot_cfg.node_capacity({"karpenter.sh/capacity-type": "on-demand"}) is Capacity.ON_DEMAND
