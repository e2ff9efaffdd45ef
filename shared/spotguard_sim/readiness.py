"""Track serving pods per workload on the simulated cluster, after every change.

"Serving" is the truth, not the API's word: a pod serves when it is Ready (and
not terminating) and the instance behind its node runs. When an instance is
reclaimed its pods stop serving at once, while the API keeps them Ready until
the node lifecycle controller notices, tens of seconds later
(:mod:`spotguard_sim.cloud`).

:class:`Tracker` subscribes to the simulated store and cloud, so a dip between
two polls is still seen: for every workload it keeps the serving pods now, the
lowest count since it was armed, and the serving count away from the doomed
nodes at the moment each doomed node went. The demo and the end-to-end tests
read it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotguard_sim import cloud as cloud_mod

Obj = dict[str, Any]


SURGE_OF = "spotguard.io/surge-of"  # spotguard.policy.surgecopy.SURGE_OF
SURGE_COPY_PREFIX = "spotguard-surge-"  # spotguard.policy.surgecopy.PREFIX
SURGE_FOR = "spotguard.io/surge-for"  # spotguard.policy.workloads.SURGE_FOR


def workload_key(pod: Obj) -> str | None:
    """``Deployment/ns/name`` or ``StatefulSet/ns/name`` of a pod, from its controller reference."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        if ref.get("kind") == "StatefulSet":
            return f"StatefulSet/{ns}/{ref['name']}"
        if ref.get("kind") == "ReplicaSet":
            labels = meta.get("labels") or {}
            of = labels.get(SURGE_OF)
            whole = str((meta.get("annotations") or {}).get(SURGE_FOR) or "")
            if of and whole.startswith("Deployment/") and ref["name"].startswith(SURGE_COPY_PREFIX):
                # A pod of spotguard's surge copy: it carries the Deployment's labels and
                # serves behind its Services (spotguard.policy.surgecopy); its annotation
                # names the Deployment whole (the label holds a digest past 63 characters).
                return f"Deployment/{ns}/{whole.split('/', 1)[1]}"
            if of and ref["name"] == SURGE_COPY_PREFIX + of:
                return f"Deployment/{ns}/{of}"
            h = labels.get("pod-template-hash", "")
            name = ref["name"][: -len(h) - 1] if h and ref["name"].endswith("-" + h) else ref["name"]
            return f"Deployment/{ns}/{name}"
    return None


def is_ready(obj: Obj) -> bool:
    """A pod (not terminating) or a node whose Ready condition is True."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def ready_counts(pods: Iterable[Obj]) -> dict[str, int]:
    """Workload key -> how many of ``pods`` are its Ready pods (pods of no workload left out)."""
    out: dict[str, int] = {}
    for p in pods:
        key = workload_key(p)
        if key and is_ready(p):
            out[key] = out.get(key, 0) + 1
    return out


def serving(pod: Mapping[str, Any], cloud: cloud_mod.Cloud) -> bool:
    """Ready, not terminating, and on a node whose instance runs."""
    node = (pod.get("spec") or {}).get("nodeName")
    return bool(node) and is_ready(dict(pod)) and cloud.running(str(node))


@dataclass
class Tracker:
    """Serving pods per workload after every store or cloud change."""

    ready: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # key -> uid -> node
    lowest: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    doomed: set[str] = field(default_factory=set)
    at_node_loss: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> key -> ready elsewhere
    armed: bool = False
    created: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # key -> placement labels
    cloud: cloud_mod.Cloud = field(default_factory=cloud_mod.Cloud)
    # Once armed: the time (``clock``) each workload first had its count at arming serving on
    # nodes that are not doomed (a workload with nothing on them: at arming)
    clock: Callable[[], float] | None = None
    covered: dict[str, float] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)  # serving at arming
    at_risk: dict[str, int] = field(default_factory=dict)  # serving on the doomed nodes at arming

    def start(self, store: Any) -> None:
        self.cloud = cloud_mod.of(store)
        self.cloud.subscribe(self.on_instance)
        pods, _ = store.list("pods")
        with self.lock:
            for p in pods:
                self._pod("ADDED", p)
        store.subscribe(self.on_change)

    def on_instance(self, node: str, state: str, when: float) -> None:
        """An instance stopped running: its pods stop serving now, whatever the API says."""
        if state == cloud_mod.RUNNING:
            return
        with self.lock:
            self._node_lost(node)
            for key, members in self.ready.items():
                for uid in [u for u, n in members.items() if n == node]:
                    del members[uid]
                if self.armed:
                    self.lowest[key] = min(self.lowest.get(key, 10**9), len(members))

    def _node_lost(self, name: str) -> None:
        if self.armed and name in self.doomed and name not in self.at_node_loss:
            self.at_node_loss[name] = {
                k: sum(1 for n in v.values() if n not in self.doomed) for k, v in self.ready.items()
            }

    def arm(self, doomed: Sequence[str]) -> None:
        """Start recording lows, new pods' placements and the state at each doomed node's loss."""
        with self.lock:
            self.doomed = set(doomed)
            self.lowest = {k: len(v) for k, v in self.ready.items()}
            self.counted = dict(self.lowest)
            on_doomed = {k: sum(1 for node in v.values() if node in self.doomed) for k, v in self.ready.items()}
            self.at_risk = {k: n for k, n in on_doomed.items() if n}
            self.armed = True
            for key in self.ready:
                self._cover(key)

    def _cover(self, key: str) -> None:
        if self.clock is None or key in self.covered or key not in self.counted:
            return
        if sum(1 for n in self.ready[key].values() if n not in self.doomed) >= self.counted[key]:
            self.covered[key] = self.clock()

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        with self.lock:
            if resource == "pods":
                self._pod(event_type, obj)
            elif resource == "nodes" and self.armed:
                name = (obj.get("metadata") or {}).get("name")
                going = event_type == "DELETED" or not is_ready({"status": obj.get("status") or {}})
                if going:
                    self._node_lost(str(name))

    def _pod(self, event_type: str, pod: Obj) -> None:
        key = workload_key(pod)
        if key is None:
            return
        uid = pod["metadata"]["uid"]
        if self.armed and event_type == "ADDED":
            self.created[key].append((pod["metadata"].get("labels") or {}).get("spotguard.io/placement", ""))
        if event_type != "DELETED" and serving(pod, self.cloud):
            self.ready[key][uid] = (pod.get("spec") or {}).get("nodeName", "")
        else:
            self.ready[key].pop(uid, None)
        if self.armed:
            self.lowest[key] = min(self.lowest.get(key, 10**9), len(self.ready[key]))
            self._cover(key)

    def count(self, key: str) -> int:
        with self.lock:
            return len(self.ready[key])

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {k: len(v) for k, v in self.ready.items()}
