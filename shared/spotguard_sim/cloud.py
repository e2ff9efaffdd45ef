"""The simulated cloud: the state of the instance behind each node.

This is the truth a real cluster's API learns late: when an instance is
terminated, stopped or hibernated, its kubelet stops at once and its pods stop
serving, but the Node and its pods keep their last reported status until the
node lifecycle controller notices (``node-monitor-grace-period``). Controllers,
the kubelet and :mod:`spotguard_sim.readiness` read it; the API never shows it.

A terminated instance goes through EC2's two states: ``shutting-down`` (the OS
stops, billing stops; the instance still exists) and, ``nodeLoss.shuttingDownSeconds``
later, ``terminated`` (it no longer exists). Stop and hibernate go straight to
``stopped``/``hibernated`` (EC2's ``stopping`` is not modelled).

One :class:`Cloud` belongs to each store (``cloud.of(store)``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RUNNING = "running"
SHUTTING_DOWN = "shutting-down"
TERMINATED = "terminated"
STOPPED = "stopped"
HIBERNATED = "hibernated"
STATE_OF_ACTION = {"terminate": SHUTTING_DOWN, "stop": STOPPED, "hibernate": HIBERNATED}
SHUT_DOWN = (STOPPED, HIBERNATED)  # a hibernated EC2 instance is in the stopped state

Callback = Callable[[str, str, float], None]  # node name, new state, simulated time


@dataclass(frozen=True)
class Instance:
    state: str
    since: float  # when it entered ``state``
    lost: float | None = None  # when it stopped running (its kubelet stopped); None while it runs


class Cloud:
    """Instance states by node name; a node the cloud has not heard of is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instances: dict[str, Instance] = {}
        self._subscribers: list[Callback] = []

    def instance(self, node: str) -> Instance | None:
        with self._lock:
            return self._instances.get(node)

    def running(self, node: str) -> bool:
        found = self.instance(node)
        return found is None or found.state == RUNNING

    def exists(self, node: str) -> bool:
        """What the AWS cloud provider's InstanceExistsByProviderID answers: false for a terminated
        one only (a shutting-down one still exists; cloud-provider-aws pkg/providers/v1/aws.go)."""
        found = self.instance(node)
        return found is None or found.state != TERMINATED

    def shut_down(self, node: str) -> bool:
        """What the AWS cloud provider's InstanceShutdownByProviderID answers: true for a stopped one
        only (not shutting-down, not terminated)."""
        found = self.instance(node)
        return found is not None and found.state in SHUT_DOWN

    def set_state(self, node: str, state: str, when: float) -> None:
        with self._lock:
            old = self._instances.get(node)
            if old is not None and old.state == state:
                return
            lost = None if state == RUNNING else (old.lost if old is not None and old.lost is not None else when)
            self._instances[node] = Instance(state, when, lost)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(node, state, when)

    def subscribe(self, callback: Callback) -> None:
        with self._lock:
            self._subscribers.append(callback)

    def unsubscribe(self, callback: Callback) -> None:
        with self._lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)


_clouds: weakref.WeakKeyDictionary[Any, Cloud] = weakref.WeakKeyDictionary()
_clouds_lock = threading.Lock()


def of(store: Any) -> Cloud:
    """The cloud behind ``store`` (created on first use)."""
    with _clouds_lock:
        found = _clouds.get(store)
        if found is None:
            found = _clouds[store] = Cloud()
        return found
