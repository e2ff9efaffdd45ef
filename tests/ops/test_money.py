"""A cycle's money: the instances' bill around the notice (spotguard.ops.money)."""

from __future__ import annotations

import pytest
from spotguard.ops import money
from spotguard_sim import catalogue, costs

PRICES = catalogue.Prices()


def test_money_reads_the_bill_at_the_notice_while_surging_and_at_the_end() -> None:
    # GIVEN one on-demand node throughout, a spot node reclaimed 120 s after the notice at t0=1000,
    # and a new spot node that joins at 1300
    spans = [costs.Span("od", "m5.xlarge", "on-demand", 0.0),
             costs.Span("spot", "m5.large", "spot", 0.0, 1120.0),
             costs.Span("spot-b", "m5.large", "spot", 1300.0)]
    got = money.measure(spans, PRICES, t0=1000.0, settled=1200.0, end=1600.0)
    # THEN the rate at the notice and at the end count both nodes; the gap in between is not billed
    assert got["before_per_hour"] == pytest.approx(0.192 + 0.048)
    assert got["after_per_hour"] == pytest.approx(0.192 + 0.048)
    assert got["cycle"]["node_seconds_by_capacity"] == {"on-demand": 600.0, "spot": 120.0 + 300.0}
    assert got["cycle"]["usd"] == pytest.approx((600 * 0.192 + 420 * 0.048) / 3600, abs=1e-4)
    assert got["during"]["seconds"] == 200.0
    # AND the same instances all on-demand cost more, and the saving says by how much
    assert got["same_nodes_on_demand"]["usd"] == pytest.approx((600 * 0.192 + 420 * 0.096) / 3600, abs=1e-4)
    assert 0 < got["saving_vs_same_nodes_on_demand"] < 1
    assert got["region"] == "us-east-1" and got["prices_dated"] == catalogue.PRICES_DATED
    assert "cost $0.240/h before the notice" in money.line(got)


def test_an_unpriced_instance_type_is_named() -> None:
    got = money.measure([costs.Span("x", "x9.huge", "spot", 0.0)], PRICES, t0=0.0, settled=10.0, end=20.0)
    assert got["unpriced_instance_types"] == ["x9.huge"]
    assert "no price for x9.huge" in money.line(got)
