"""The surge record: what a surge did, written as JSON on the workload
(``spotguard.io/surge``), read by the interruption plans, the floors (a surging
workload's floor), the eviction guard and node-added. Pure; no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Protocol

from spotguard.policy.workloads import SURGE, Workload

# Set (on the workload view only, never on the cluster) by the adapter when the record
# came from the ledger because the workload's own annotation is gone.
LOST = "spotguard.io/surge-lost"
# In a workload's view only (never written): its surge record is its surge copy's.
ON_COPY = "spotguard.io/surge-on-copy"


class AutoscalerLimits(Protocol):
    """What a record compares of a HorizontalPodAutoscaler (``interruption.Autoscaler``)."""

    @property
    def min_replicas(self) -> int: ...

    @property
    def max_replicas(self) -> int: ...

    @property
    def spotguard_min(self) -> int | None: ...

    @property
    def spotguard_max(self) -> int | None: ...


@dataclass(frozen=True)
class SurgeRecord:
    """What a surge did, written as JSON on the workload (``spotguard.io/surge``).

    ``replicas`` is the count the owner wanted when the surge began and ``written``
    the count spotguard last wrote: a workload whose ``spec.replicas`` is no longer
    ``written`` was changed by someone else (GitOps, a person, an autoscaler), and
    the scale back keeps that change (:func:`owner_replicas`).
    """

    replicas: int  # spec.replicas before the surge (where the user left it)
    surge: int  # replicas added
    events: tuple[str, ...] = ()  # event ids that asked for it
    nodes: tuple[str, ...] = ()  # doomed nodes it covers
    started: float = 0.0  # epoch seconds
    hpa: str = ""  # the HorizontalPodAutoscaler whose limits were raised
    hpa_min: int | None = None  # its minReplicas before
    hpa_max: int | None = None  # its maxReplicas before, where it was raised
    budget: str = ""  # the temporary PodDisruptionBudget, where one is wanted
    # Scaled back while a doomed node still exists: kept (surge 0) so that a
    # replayed notice for those nodes changes nothing; removed once they are gone.
    done: bool = False
    written: int | None = None  # spec.replicas spotguard last wrote (None: replicas + surge)
    until: tuple[tuple[str, float], ...] = ()  # node -> its reclaim time (or a rebalance's end)
    hpa_set: int | None = None  # the minReplicas spotguard set (restored only while it holds)
    hpa_max_set: int | None = None  # the maxReplicas spotguard set
    ready: int = 0  # Ready pods when the surge began: the serving count to keep
    # node -> the workload's pods on it that the surge already replaces. A pod placed on a
    # doomed node after its surge (its taint not written yet: a write that failed and is
    # retried, a pod admitted unchanged) dies with it too: the next plan adds one for it.
    counts: tuple[tuple[str, int], ...] = ()
    # The nodes whose deadline is a rebalance recommendation's end (no reclaim time: they live
    # on). None: a record from before this was kept (the nodes' own notices tell).
    rebalance: tuple[str, ...] | None = None
    # Read from the ledger because the workload lost its annotation (kubectl replace,
    # Argo CD Replace=true): never written on the workload again.
    lost: bool = False
    # The surge is a spotguard-owned copy of the Deployment (policy.surgecopy): its replicas
    # are the copy's pods, not the Deployment's, so ``surge`` raises neither its
    # spec.replicas nor its on-demand floor.
    copy: bool = False
    # The doomed nodes that are spot and only drained by a node autoscaler (no reclaim: the
    # market is not taking them): their pods' replacements need no on-demand capacity, so
    # the part of ``surge`` that covers them (``counts``) raises no on-demand floor
    # (:meth:`on_demand_surge`). A warning for such a node takes it out of the set.
    spot_drains: tuple[str, ...] = ()
    # node -> how many of the workload's pods on an on-demand node an autoscaler only drains
    # (consolidation: Karpenter's replace or delete, the Cluster Autoscaler's scale-down) the
    # floor does not need on on-demand: the workload keeps its floor's on-demand replicas
    # elsewhere, so these replacements need no on-demand either (a replica waiting there for
    # its return to spot, say). A warning for such a node takes it out.
    spare_drains: tuple[tuple[str, int], ...] = ()

    @property
    def on_demand_surge(self) -> int:
        """The surge replicas that must be on-demand: all but those replacing pods of a node an
        autoscaler drains that the floor does not need there (a spot node's: they go where the
        workload's other spot replicas go; an on-demand node's beyond the floor)."""
        if not self.spot_drains and not self.spare_drains:
            return max(self.surge, 0)
        drained = dict(self.counts)
        free = sum(drained.get(n, 0) for n in self.spot_drains)
        free += sum(min(k, drained.get(n, 0)) for n, k in self.spare_drains if n not in self.spot_drains)
        return max(self.surge - free, 0)

    def min_is_ours(self, hpa: AutoscalerLimits) -> bool:
        """The autoscaler's minReplicas holds a value spotguard set: the record's, or the one
        the autoscaler itself says spotguard last set (the record is written before the
        autoscaler, and that raise may have failed, leaving an earlier raise of ours)."""
        return self.hpa_set is not None and hpa.min_replicas in (self.hpa_set, hpa.spotguard_min)

    def max_is_ours(self, hpa: AutoscalerLimits) -> bool:
        return self.hpa_max_set is not None and hpa.max_replicas in (self.hpa_max_set, hpa.spotguard_max)

    @property
    def last_written(self) -> int:
        return self.replicas + self.surge if self.written is None else self.written

    def deadline(self, node: str, default: float) -> float:
        for name, t in self.until:
            if name == node:
                return t
        return default

    def to_json(self) -> str:
        out: dict[str, Any] = {
            "replicas": self.replicas,
            "surge": self.surge,
            "events": list(self.events),
            "nodes": list(self.nodes),
            "started": round(self.started, 3),
        }
        if self.written is not None:
            out["written"] = self.written
        if self.until:
            out["until"] = {n: round(t, 3) for n, t in self.until}
        if self.ready:
            out["ready"] = self.ready
        if self.counts:
            out["counts"] = dict(self.counts)
        if self.rebalance is not None:
            out["rebalance"] = list(self.rebalance)
        if self.hpa:
            out["hpa"] = {"name": self.hpa, "minReplicas": self.hpa_min, "maxReplicas": self.hpa_max}
            if self.hpa_set is not None:
                out["hpa"]["setMin"] = self.hpa_set
            if self.hpa_max_set is not None:
                out["hpa"]["setMax"] = self.hpa_max_set
        if self.budget:
            out["budget"] = self.budget
        if self.done:
            out["done"] = True
        if self.copy:
            out["copy"] = True
        if self.spot_drains:
            out["spotDrains"] = list(self.spot_drains)
        if self.spare_drains:
            out["spareDrains"] = dict(self.spare_drains)
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> SurgeRecord | None:
        """The record in ``text``, or None where it is not one (never raises)."""
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        try:
            hpa = raw.get("hpa") or {}
            if not isinstance(hpa, dict):
                hpa = {}
            until = raw.get("until") or {}
            counts = raw.get("counts") or {}
            return cls(
                replicas=_int(raw["replicas"]),
                surge=_int(raw["surge"]),
                events=tuple(str(e) for e in raw.get("events") or ()),
                nodes=tuple(str(n) for n in raw.get("nodes") or ()),
                started=float(raw.get("started") or 0.0),
                hpa=str(hpa.get("name") or ""),
                hpa_min=_opt_int(hpa.get("minReplicas")),
                hpa_max=_opt_int(hpa.get("maxReplicas")),
                budget=str(raw.get("budget") or ""),
                done=raw.get("done") is True,
                written=_opt_int(raw.get("written")),
                until=tuple(sorted((str(n), float(t)) for n, t in until.items())) if isinstance(until, dict) else (),
                hpa_set=_opt_int(hpa.get("setMin")),
                hpa_max_set=_opt_int(hpa.get("setMax")),
                ready=_int(raw.get("ready") or 0),
                counts=_node_counts(counts),
                rebalance=tuple(str(n) for n in raw["rebalance"]) if isinstance(raw.get("rebalance"), list) else None,
                copy=raw.get("copy") is True,
                spot_drains=tuple(str(n) for n in raw["spotDrains"]) if isinstance(raw.get("spotDrains"), list) else (),
                spare_drains=_node_counts(raw.get("spareDrains")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    @classmethod
    def of(cls, workload: Workload) -> SurgeRecord | None:
        raw = workload.annotations.get(SURGE)
        if not raw:
            return None
        record = cls.parse(raw)
        if record is not None and workload.annotations.get(LOST) == "true":
            record = dataclasses.replace(record, lost=True)
        return record




def _node_counts(raw: Any) -> tuple[tuple[str, int], ...]:
    """``{node: count}`` as sorted pairs; () where it is not such a map."""
    return tuple(sorted((str(n), _int(c)) for n, c in raw.items())) if isinstance(raw, dict) else ()


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not an integer: {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)
