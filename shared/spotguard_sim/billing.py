"""The simulated cloud's bill: when each instance ran, by instance type and capacity type.

One :class:`Ledger` belongs to each store (``billing.of(store)``). An instance is
billed from its launch (a scenario's nodes: from the ledger's start; a provisioner's:
from the launch it records) until the cloud terminates or stops it, or its Node is
deleted, whichever comes first. The arithmetic is :mod:`spotguard_sim.costs`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

from spotguard.policy import capacity as capacity_labels

from spotguard_sim import cloud as cloud_mod
from spotguard_sim import costs

INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def capacity_type(labels: Mapping[str, str]) -> str:
    """``spot`` or ``on-demand`` (a node no scheme classifies pays on-demand: never kinder)."""
    own = labels.get("karpenter.sh/capacity-type")
    if own == "reserved":
        return "reserved"
    found = capacity_labels.classify(labels)
    return "spot" if found is capacity_labels.Capacity.SPOT else "on-demand"


class Ledger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, costs.Span] = {}  # running instances by node name
        self._closed: list[costs.Span] = []

    def launch(self, name: str, instance_type: str, capacity: str, at: float) -> None:
        with self._lock:
            if name not in self._spans:
                self._spans[name] = costs.Span(name, instance_type, capacity, at)

    def observe(self, node: Mapping[str, Any], at: float) -> None:
        """A node seen in the cluster: billed from ``at`` unless its launch was recorded."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        self.launch(str(meta.get("name") or ""), str(labels.get(INSTANCE_TYPE) or "unknown"),
                    capacity_type(labels), at)

    def end(self, name: str, at: float) -> None:
        with self._lock:
            span = self._spans.pop(name, None)
            if span is not None:
                self._closed.append(costs.Span(span.name, span.instance_type, span.capacity_type,
                                               span.start, max(span.start, at)))

    def spans(self) -> list[costs.Span]:
        with self._lock:
            return [*self._closed, *self._spans.values()]

    def running(self) -> list[costs.Span]:
        with self._lock:
            return list(self._spans.values())


class Meter:
    """Keeps a ledger up to date from the store's node events and the cloud's instance states."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ledger = of(store)
        self.cloud = cloud_mod.of(store)

    def start(self) -> Meter:
        now = self.store.clock.now()
        for node in self.store.list("nodes")[0]:
            self.ledger.observe(node, now)
        self.store.subscribe(self._on_event, ("nodes",))
        self.cloud.subscribe(self._on_instance)
        return self

    def stop(self) -> None:
        unsubscribe = getattr(self.store, "unsubscribe", None)
        if unsubscribe is not None:
            unsubscribe(self._on_event)
        self.cloud.unsubscribe(self._on_instance)

    def _on_event(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "nodes":
            return
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event_type == "DELETED":
            self.ledger.end(name, self.store.clock.now())
        elif event_type == "ADDED":
            self.ledger.observe(obj, self.store.clock.now())

    def _on_instance(self, node: str, state: str, when: float) -> None:
        if state != cloud_mod.RUNNING:
            self.ledger.end(node, when)


_ledgers: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()
_ledgers_lock = threading.Lock()


def of(store: Any) -> Ledger:
    """The ledger of ``store``'s cloud (created on first use)."""
    with _ledgers_lock:
        return _ledgers.setdefault(store, Ledger())
