"""What a cluster's instances cost: node-seconds x price by capacity type (pure arithmetic).

EC2 bills Linux on-demand and spot instances per second with a minimum of 60
seconds (https://aws.amazon.com/ec2/pricing/on-demand/, "Per-second billing"); a spot
instance that EC2 interrupts is charged for the seconds it ran
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/billing-for-interrupted-spot-instances.html).
An instance is billed from its launch to its termination, not from its Node's
registration to its deletion: a node still booting costs money.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

MINIMUM_SECONDS = 60.0
HOUR = 3600.0
PriceOf = Callable[[str, str], "float | None"]  # (instance type, capacity type) -> USD per hour


@dataclasses.dataclass(frozen=True)
class Span:
    """One instance's life: launched at ``start``, terminated at ``end`` (None: still running)."""

    name: str
    instance_type: str
    capacity_type: str
    start: float
    end: float | None = None


@dataclasses.dataclass(frozen=True)
class Bill:
    """The cost of a window: USD and instance-seconds by capacity type, and types with no price."""

    start: float
    end: float
    usd: dict[str, float]
    seconds: dict[str, float]
    unpriced: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(self.usd.values())

    @property
    def per_hour(self) -> float:
        """The window's average cost per hour."""
        length = self.end - self.start
        return self.total * HOUR / length if length > 0 else 0.0


def billed_seconds(span: Span, start: float, end: float) -> float:
    """The seconds of ``span`` billed inside [start, end): the overlap, plus the shortfall of
    the 60-second minimum when the instance ended (or was launched) inside the window."""
    if end <= start:
        return 0.0
    life_end = span.end if span.end is not None else end
    overlap = max(0.0, min(life_end, end) - max(span.start, start))
    if span.end is not None and start <= span.start < end:
        life = span.end - span.start
        if life < MINIMUM_SECONDS:
            overlap += MINIMUM_SECONDS - life
    return overlap


def bill(spans: Iterable[Span], price: PriceOf, start: float, end: float) -> Bill:
    usd: dict[str, float] = {}
    seconds: dict[str, float] = {}
    unpriced: set[str] = set()
    for span in spans:
        secs = billed_seconds(span, start, end)
        if secs <= 0:
            continue
        seconds[span.capacity_type] = seconds.get(span.capacity_type, 0.0) + secs
        hourly = price(span.instance_type, span.capacity_type)
        if hourly is None:
            unpriced.add(span.instance_type)
            continue
        usd[span.capacity_type] = usd.get(span.capacity_type, 0.0) + secs * hourly / HOUR
    return Bill(start, end, usd, seconds, tuple(sorted(unpriced)))


def rate(spans: Iterable[Span], price: PriceOf, at: float) -> float:
    """USD per hour of the instances running at ``at``."""
    total = 0.0
    for span in spans:
        if span.start <= at and (span.end is None or at < span.end):
            total += price(span.instance_type, span.capacity_type) or 0.0
    return total


def saving(cost: float, baseline: float) -> float | None:
    """The share of ``baseline`` that ``cost`` saves (0.4: 40 % cheaper); None without a baseline."""
    if baseline <= 0:
        return None
    return 1.0 - cost / baseline
