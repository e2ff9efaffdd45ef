"""What spotguard's surge copies (``surge_copy``, the default) did on the simulated cluster,
seen through a watch on the store: the copy ReplicaSets made (``spotguard-surge-<name>``,
labelled ``spotguard.io/surge-of``), their sizes, and the nodes their pods were bound to.
The end-to-end tests read it where a replica surge's traces (spec.replicas raised) were
read before: the copy leaves none on the Deployment.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from spotguard.policy.workloads import SURGE_OF, surge_copy_name

from tests.interruption import sim_scenario

Obj = dict[str, Any]


def copies_now(store: Any) -> dict[str, Obj]:
    """Deployment key -> its surge copy in the store now."""
    out = {}
    for rs in store.list("replicasets")[0]:
        meta = rs["metadata"]
        of = (meta.get("labels") or {}).get(SURGE_OF)
        if of:
            out[f"Deployment/{meta['namespace']}/{of}"] = rs
    return out


class CopyWatch:
    """Per Deployment key: the sizes its copy was given (in order) and the nodes the copy's
    pods were bound to; the capacity type of every node seen."""

    def __init__(self, store: Any) -> None:
        self.lock = threading.Lock()
        self.names: dict[str, set[str]] = defaultdict(set)  # key -> copy names seen
        self.sizes: dict[str, list[int]] = defaultdict(list)  # key -> spec.replicas, each change
        self.pod_nodes: dict[str, set[str]] = defaultdict(set)  # key -> nodes of its copy's pods
        self.pods: dict[str, set[str]] = defaultdict(set)  # key -> uids of its copy's pods
        self.capacity: dict[str, str] = {}  # node -> capacity type
        for n in store.list("nodes")[0]:
            self._node(n)
        store.subscribe(self.on_change, ("replicasets", "pods", "nodes"))

    def _node(self, node: Obj) -> None:
        meta = node["metadata"]
        self.capacity[meta["name"]] = (meta.get("labels") or {}).get(sim_scenario.CAPACITY, "")

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        with self.lock:
            if resource == "nodes":
                if event_type != "DELETED":
                    self._node(obj)
                return
            of = (meta.get("labels") or {}).get(SURGE_OF)
            if not of:
                return
            key = f"Deployment/{meta.get('namespace')}/{of}"
            if resource == "replicasets":
                self.names[key].add(str(meta.get("name")))
                if event_type != "DELETED":
                    size = int((obj.get("spec") or {}).get("replicas") or 0)
                    if not self.sizes[key] or self.sizes[key][-1] != size:
                        self.sizes[key].append(size)
            elif resource == "pods":
                self.pods[key].add(str(meta.get("uid")))
                node = (obj.get("spec") or {}).get("nodeName")
                if node:
                    self.pod_nodes[key].add(str(node))

    def surged(self) -> set[str]:
        """The Deployments a copy was made for."""
        with self.lock:
            return set(self.sizes)

    def assert_copied_on_demand(self, key: str, surge: int, count: int, *, exact: bool) -> None:
        """A copy named ``spotguard-surge-<name>`` was made for ``key`` and every pod of it was
        bound to an on-demand node. Its sizes never exceeded ``count`` (the Deployment's count
        before the notice: the copy holds what its own pods on nodes that stay lack of it);
        ``exact``: at its largest it held the record's ``surge`` (nothing else took a pod
        between the notices and the reads: the doomed pods were all Ready and counted)."""
        with self.lock:
            name = key.rsplit("/", 1)[1]
            sizes = self.sizes[key]
            assert self.names[key] == {surge_copy_name(name)}, (key, self.names[key])
            assert sizes and sizes[0] >= 1 and max(sizes) <= count, (key, sizes, count)
            if exact:
                assert max(sizes) == surge, (key, sizes, surge)
            assert self.pods[key], (key, "no pod of the copy")
            places = {n: self.capacity.get(n) for n in self.pod_nodes[key]}
            assert places and all(c == "on-demand" for c in places.values()), (key, places)
