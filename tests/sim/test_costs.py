"""The instance catalogue and the cost arithmetic, against the sources docs/sim.md cites."""

from __future__ import annotations

import pytest
from spotguard_sim import catalogue, costs


def test_on_demand_prices_are_karpenters_us_east_1_snapshot() -> None:
    # GIVEN aws/karpenter-provider-aws zz_generated.pricing_aws.go (generated 2026-07-20, us-east-1)
    # THEN the catalogue carries the same USD per hour
    assert catalogue.TYPES["m5.large"].on_demand == 0.096
    assert catalogue.TYPES["m5.xlarge"].on_demand == 0.192
    assert catalogue.TYPES["m5.2xlarge"].on_demand == 0.384
    assert catalogue.TYPES["m5a.large"].on_demand == 0.086


def test_spot_is_cheaper_but_never_free() -> None:
    for t in catalogue.TYPES.values():
        assert 0 < t.spot < t.on_demand


def test_every_scenario_instance_type_is_priced() -> None:
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    used = set()
    for path in (root / "infra" / "scenarios").glob("*.yaml"):
        used |= set(re.findall(r"(?:instance-type|instanceType): *([a-z0-9]+\.[a-z0-9]+)", path.read_text()))
    assert used
    assert used <= set(catalogue.TYPES), sorted(used - set(catalogue.TYPES))


def test_pod_limit_is_the_vpc_cni_eni_formula() -> None:
    # eni-max-pods.txt: m5.large 29, m5.xlarge 58, m5.2xlarge 58, m5.4xlarge 234
    assert [catalogue.TYPES[n].max_pods for n in ("m5.large", "m5.xlarge", "m5.2xlarge", "m5.4xlarge")] == [
        29, 58, 58, 234]


def test_allocatable_subtracts_what_karpenter_subtracts() -> None:
    # m5.xlarge: 4 vCPU - (60 + 10 + 5 + 5)m kube-reserved; 16 GiB - ceil(7.5 %) - (11 x 58 + 255) - 100 MiB
    assert catalogue.TYPES["m5.xlarge"].allocatable() == {"cpu": "3920m", "memory": "14162Mi", "pods": "58"}
    # m5.2xlarge: 8 vCPU -> 80m + 0.25 % of the 4 cores above 4 (10m)
    assert catalogue.TYPES["m5.2xlarge"].allocatable()["cpu"] == "7910m"


def test_a_scenarios_own_prices_win() -> None:
    prices = catalogue.Prices({"m5.xlarge": {"spot": 0.05}})
    assert prices.hourly("m5.xlarge", "spot") == 0.05
    assert prices.hourly("m5.xlarge", "on-demand") == 0.192
    assert prices.hourly("x9.huge", "spot") is None


PRICE = catalogue.Prices().hourly


def test_cost_is_node_seconds_times_price_by_capacity_type() -> None:
    spans = [costs.Span("od", "m5.xlarge", "on-demand", 0, 3600),
             costs.Span("s1", "m5.xlarge", "spot", 0, None),
             costs.Span("s2", "m5.xlarge", "spot", 1800, 2700)]
    got = costs.bill(spans, PRICE, 0, 3600)
    assert got.seconds == {"on-demand": 3600, "spot": 3600 + 900}
    assert got.usd["on-demand"] == pytest.approx(0.192)
    assert got.usd["spot"] == pytest.approx(0.096 * 1.25)
    assert got.per_hour == pytest.approx(0.192 + 0.12)


def test_a_window_bills_only_its_overlap() -> None:
    span = costs.Span("od", "m5.xlarge", "on-demand", 100, 500)
    assert costs.billed_seconds(span, 0, 300) == 200
    assert costs.billed_seconds(span, 300, 1000) == 200
    assert costs.billed_seconds(span, 600, 1000) == 0


def test_an_instance_is_billed_at_least_a_minute() -> None:
    # EC2 per-second billing has a 60-second minimum
    span = costs.Span("brief", "m5.xlarge", "on-demand", 10, 30)
    assert costs.billed_seconds(span, 0, 100) == 60
    assert costs.bill([span], PRICE, 0, 100).total == pytest.approx(0.192 * 60 / 3600)


def test_rate_counts_the_instances_running_then() -> None:
    spans = [costs.Span("a", "m5.xlarge", "on-demand", 0, 10), costs.Span("b", "m5.large", "spot", 5, None)]
    assert costs.rate(spans, PRICE, 7) == pytest.approx(0.192 + 0.048)
    assert costs.rate(spans, PRICE, 10) == pytest.approx(0.048)


def test_unpriced_types_are_named_not_guessed() -> None:
    got = costs.bill([costs.Span("x", "x9.huge", "spot", 0, 100)], PRICE, 0, 100)
    assert got.total == 0 and got.unpriced == ("x9.huge",)


def test_saving_against_a_baseline() -> None:
    assert costs.saving(60.0, 100.0) == pytest.approx(0.4)
    assert costs.saving(1.0, 0.0) is None
