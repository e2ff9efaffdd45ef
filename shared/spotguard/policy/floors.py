"""The on-demand floor of a workload: defaults, annotations, opt-out.

| workload                     | default floor |
| Deployment, 1 replica        | 1             |
| Deployment, n >= 2 replicas  | 1             |
| StatefulSet, 1 replica       | 1             |
| StatefulSet, n >= 2 replicas | n // 2 + 1    |

``spotguard.io/min-on-demand`` overrides it with a count ("3") or a
percentage ("30%", rounded up), clamped to the replica count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spotguard.policy.surges import SurgeRecord
from spotguard.policy.validation import Problem
from spotguard.policy.workloads import ENABLED, MIN_ON_DEMAND, SURGE, Kind, Workload

if TYPE_CHECKING:
    from spotguard.policy.config import Config


@dataclass(frozen=True)
class Count:
    value: int

    def resolve(self, replicas: int) -> int:
        return min(self.value, replicas)


@dataclass(frozen=True)
class Percent:
    value: int

    def resolve(self, replicas: int) -> int:
        return min(replicas, math.ceil(replicas * self.value / 100))


FloorSpec = Count | Percent

_COUNT = re.compile(r"^\d{1,6}$")
_PERCENT = re.compile(r"^(\d{1,3})%$")


def parse_min_on_demand(text: str) -> FloorSpec | Problem:
    value = text.strip()
    if _COUNT.match(value):
        return Count(int(value))
    m = _PERCENT.match(value)
    if m:
        pct = int(m.group(1))
        if pct > 100:
            return Problem(MIN_ON_DEMAND, text, "a percentage must be between 0% and 100%")
        return Percent(pct)
    return Problem(MIN_ON_DEMAND, text, 'expected a whole number ("3") or a percentage ("30%")')


def default_floor(kind: Kind, replicas: int) -> int:
    if replicas <= 0:
        return 0
    if kind is Kind.STATEFULSET and replicas >= 2:
        return replicas // 2 + 1
    return 1


def parse_enabled(
    annotations: Mapping[str, str], field: str = ENABLED
) -> tuple[bool, Problem | None]:
    raw = annotations.get(ENABLED)
    if raw is None:
        return True, None
    value = raw.strip().lower()
    if value == "false":
        return False, None
    if value == "true":
        return True, None
    return True, Problem(field, raw, 'expected "true" or "false"; spotguard stays enabled')


@dataclass(frozen=True)
class Floor:
    """What the policy decided for one workload."""

    enabled: bool
    on_demand: int  # includes ``surge``
    source: str  # "default", "config", "annotation" or "disabled"
    problems: tuple[Problem, ...] = ()
    surge: int = 0  # extra on-demand replicas of an interruption surge in progress
    # When that surge began (epoch seconds, the handler's clock): the pods created since
    # are its replicas; an on-demand pod from before (a spilled one, an earlier surge's)
    # counts against the floor, never as one of this surge's replicas.
    surge_since: float = 0.0

    def spot(self, replicas: int) -> int:
        return max(0, replicas - self.on_demand)


def floor_for(
    workload: Workload,
    config: Config,
    namespace_annotations: Mapping[str, str] | None = None,
    replicas: int | None = None,
) -> Floor:
    """The on-demand floor of ``workload`` (at ``replicas``, default its own).

    While an interruption surge is in progress (``spotguard.io/surge``) the surge
    replicas are on-demand too: the floor is the usual floor of the count the owner
    wants (not of the surged count: a percentage floor would rise with the surge and
    give an extra an on-demand slot with a deletion cost, and the scale back would
    then remove a spot pod of a node that lives on) plus the surge.

    The replicas replacing pods of a spot node that a node autoscaler drains (no reclaim:
    ``record.spot_drains``) are not among those on-demand ones: they go where the
    workload's spot replicas go, into the room the autoscaler's own simulation found for
    the drained pods. Pinned to on-demand they would make it launch an on-demand node for
    every consolidation of a spot node, a node it consolidates in turn once the surge is
    over: the cluster never settles, and its steady cost rises above all on-demand's.

    A surge by a copy (``record.copy``, :mod:`spotguard.policy.surgecopy`) leaves the floor
    as it is: the copy's own pods are its on-demand replicas, pinned by its template, and
    the Deployment's own pods (the replacements of its doomed ones among them) fill its
    usual floor, spot preferred, as without a surge.
    """
    n = max(workload.replicas if replicas is None else replicas, 0)
    record = SurgeRecord.of(workload)
    if record is None or record.copy:
        return _base_floor(workload, config, namespace_annotations, n)
    extra, before, written = _counts(record)
    base = _base_floor(workload, config, namespace_annotations, min(n, owner_count(before, written, n)))
    if not base.enabled or extra == 0:
        return base
    on_demand = min(n, base.on_demand + extra)
    return Floor(True, on_demand, base.source, base.problems, on_demand - base.on_demand, record.started)


def owner_count(before: int, written: int, current: int) -> int:
    """The count a workload's owner wants during a surge: ``before`` (the count at the
    surge) while ``spec.replicas`` is still what spotguard ``written``; theirs where someone
    lowered it; ``before`` plus what they added where someone raised it."""
    if current == written:
        return before
    if current > written:
        return before + (current - written)
    return current


def surge_of(annotations: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(surge, replicas before it, replicas spotguard last wrote) of the record in
    ``spotguard.io/surge``; None: none, or unreadable."""
    raw = annotations.get(SURGE)
    record = SurgeRecord.parse(raw) if raw else None
    return None if record is None else _counts(record)


def _counts(record: SurgeRecord) -> tuple[int, int, int]:
    return record.on_demand_surge, max(record.replicas, 0), max(record.last_written, 0)


def base_spec(
    workload: Workload, config: Config, namespace_annotations: Mapping[str, str] | None = None
) -> FloorSpec | None:
    """A Deployment's base floor as a function of its replica count (no surge); None for
    a StatefulSet's default floor (not of that form) and for a workload left alone."""
    source, spec, _ = _spec(workload, config, namespace_annotations)
    if source == "disabled":
        return None
    if spec is None and workload.kind is Kind.DEPLOYMENT:
        return Count(1)  # the default: 1 at every count
    return spec


def _spec(
    workload: Workload, config: Config, namespace_annotations: Mapping[str, str] | None
) -> tuple[str, FloorSpec | None, tuple[Problem, ...]]:
    """(source, spec, problems): the spec None for "disabled" and "default"."""
    problems: list[Problem] = []
    ns_enabled, ns_problem = parse_enabled(namespace_annotations or {}, "namespace " + ENABLED)
    wl_enabled, wl_problem = parse_enabled(workload.annotations)
    problems += [p for p in (ns_problem, wl_problem) if p is not None]
    if workload.namespace in config.excluded_namespaces or not ns_enabled or not wl_enabled:
        return "disabled", None, tuple(problems)
    raw = workload.annotations.get(MIN_ON_DEMAND)
    if raw is not None:
        spec = parse_min_on_demand(raw)
        if isinstance(spec, Problem):
            problems.append(spec)
        else:
            return "annotation", spec, tuple(problems)
    if config.default_min_on_demand is not None:
        return "config", config.default_min_on_demand, tuple(problems)
    return "default", None, tuple(problems)


def _base_floor(
    workload: Workload,
    config: Config,
    namespace_annotations: Mapping[str, str] | None,
    replicas: int | None,
) -> Floor:
    n = workload.replicas if replicas is None else replicas
    source, spec, problems = _spec(workload, config, namespace_annotations)
    if source == "disabled":
        return Floor(False, 0, "disabled", problems)
    if spec is not None:
        return Floor(True, spec.resolve(max(n, 0)), source, problems)
    return Floor(True, default_floor(workload.kind, n), "default", problems)


def every_pod_is_floor(workload: Workload, floor: Floor) -> bool:
    """A StatefulSet whose floor is all of its replicas (1 or 2 by default: the quorum of
    either is all of it). Its pods cannot be replaced before they are gone, so any
    voluntary disruption (a node autoscaler's consolidation or scale-down) takes it below
    its floor: admission asks the autoscalers to leave their nodes alone
    (``patches.floor_protection``)."""
    return workload.kind is Kind.STATEFULSET and floor.enabled and 0 < workload.replicas <= floor.on_demand
