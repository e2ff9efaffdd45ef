"""The simulated cloud: the state of the instance behind each node.

This is the truth a real cluster's API learns late: when an instance is
terminated, stopped or hibernated, its kubelet stops at once and its pods stop
serving, but the Node and its pods keep their last reported status until the
node lifecycle controller notices (``node-monitor-grace-period``). Controllers,
the kubelet and :mod:`spotguard.sim.readiness` read it; the API never shows it.

A terminated instance goes ``running -> shutting-down -> terminated`` as on EC2
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html):
``terminate`` puts it in ``shutting-down`` (not running, not billed, but it still
exists), and the cloud's controller (:class:`spotguard.sim.controllers.instances.Reclaimer`)
makes it ``terminated`` ``nodeLoss.shuttingDownSeconds`` later. cloud-provider-aws
says an instance exists unless it is ``terminated`` and is shut down only when
``stopped`` (``InstanceExistsByProviderID``, ``InstanceShutdownByProviderID`` in
``pkg/providers/v1/aws.go``); a hibernated EC2 instance is ``stopped`` too.

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
SHUT_DOWN = (STOPPED, HIBERNATED)  # EC2 state "stopped": what InstanceShutdownByProviderID reports

Callback = Callable[[str, str, float], None]  # node name, new state, simulated time


@dataclass(frozen=True)
class Instance:
    state: str
    since: float  # when it entered ``state``
    down_since: float | None = None  # when it stopped running (its kubelet died); None while it runs


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
        """What the cloud provider's InstanceExistsByProviderID answers: a terminated one does not
        (a shutting-down one does)."""
        found = self.instance(node)
        return found is None or found.state != TERMINATED

    def shutdown(self, node: str) -> bool:
        """What cloud-provider-aws's InstanceShutdownByProviderID answers: true for a stopped
        instance only (not shutting-down, not terminated)."""
        found = self.instance(node)
        return found is not None and found.state in SHUT_DOWN

    def terminate(self, node: str, when: float) -> None:
        """TerminateInstances: a running or stopped instance starts shutting down; one already
        shutting down or terminated is left as it is."""
        self.set_state(node, SHUTTING_DOWN, when, unless=(TERMINATED,))

    def set_state(self, node: str, state: str, when: float, *, unless: tuple[str, ...] = ()) -> None:
        """``node``'s instance enters ``state`` at ``when`` (nothing when it is in ``state`` or ``unless``)."""
        with self._lock:
            old = self._instances.get(node)
            if old is not None and (old.state == state or old.state in unless):
                return
            down_since = None
            if state != RUNNING:
                down_since = old.down_since if old is not None and old.down_since is not None else when
            self._instances[node] = Instance(state, when, down_since)
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
