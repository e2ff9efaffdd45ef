"""What a cycle cost in money: the cluster's instances, node-seconds x price by capacity type.

Read from the simulated cloud's bill (:mod:`spotguard_sim.billing`; prices and their
sources in :mod:`spotguard_sim.catalogue` and docs/sim.md). Three instants and two
windows, from the notice (``t0``):

- ``before_per_hour``: what the instances running at the notice cost an hour;
- ``during``: from the notice until the surges are over (the doomed nodes gone);
- ``after_per_hour``: what the instances running at the end cost an hour;
- ``cycle``: from the notice to the end;
- ``same_nodes_on_demand``: the cycle's very instances priced on-demand: what the
  same capacity would cost without spot (not a provisioned on-demand cluster, which
  would pack the pods differently).
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import catalogue, costs


def _window(bill: costs.Bill) -> dict[str, Any]:
    return {
        "usd": round(bill.total, 4),
        "usd_per_hour": round(bill.per_hour, 4),
        "seconds": round(bill.end - bill.start, 1),
        "usd_by_capacity": {k: round(v, 4) for k, v in sorted(bill.usd.items())},
        "node_seconds_by_capacity": {k: round(v, 1) for k, v in sorted(bill.seconds.items())},
    }


def measure(spans: list[costs.Span], prices: catalogue.Prices, *, t0: float, settled: float,
            end: float) -> dict[str, Any]:
    """The money of a cycle (JSON-ready)."""
    price = prices.hourly
    cycle_bill = costs.bill(spans, price, t0, end)
    on_demand = costs.bill(spans, lambda t, _c: price(t, "on-demand"), t0, end)
    unpriced = sorted(set(cycle_bill.unpriced) | set(on_demand.unpriced))
    return {
        "region": catalogue.REGION,
        "prices_dated": catalogue.PRICES_DATED,
        "before_per_hour": round(costs.rate(spans, price, t0), 4),
        "during": _window(costs.bill(spans, price, t0, max(t0, settled))),
        "after_per_hour": round(costs.rate(spans, price, end - 1e-6), 4),
        "cycle": _window(cycle_bill),
        "same_nodes_on_demand": _window(on_demand),
        "saving_vs_same_nodes_on_demand": saving(cycle_bill.total, on_demand.total),
        "unpriced_instance_types": unpriced,
    }


def saving(usd: float, base_usd: float) -> float | None:
    """The share of ``base_usd`` that ``usd`` saves, as the reports carry it (rounded; None without a base)."""
    found = costs.saving(usd, base_usd)
    return None if found is None else round(found, 4)


def line(money: dict[str, Any]) -> str:
    """One line for people: the cluster's cost an hour at three moments, and the cycle's cost."""
    cycle = money["cycle"]
    text = (f"cluster cost ${money['before_per_hour']:.3f}/h before the notice, "
            f"${money['during']['usd_per_hour']:.3f}/h on average until the surges ended, "
            f"${money['after_per_hour']:.3f}/h after; the cycle ({cycle['seconds']:.0f}s) cost "
            f"${cycle['usd']:.4f} (the same nodes all on-demand: ${money['same_nodes_on_demand']['usd']:.4f})")
    if money["unpriced_instance_types"]:
        text += f"; no price for {', '.join(money['unpriced_instance_types'])}"
    return text
