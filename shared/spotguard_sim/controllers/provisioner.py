"""Karpenter's provisioner: launches nodes for pods the scheduler cannot place.

As kubernetes-sigs/karpenter does it (sources in docs/sim.md):
- pods with ``PodScheduled=False`` reason ``Unschedulable`` are batched: a batch
  closes once no new such pod came for ``BATCH_IDLE_DURATION`` (1 s) or
  ``BATCH_MAX_DURATION`` (10 s) after it opened (pkg/controllers/provisioning/batcher.go);
- each batch is packed first-fit, largest pods first, into room left on nodes still
  launching and then into new NodeClaims; a NodeClaim keeps every offering that still
  holds all its pods plus the DaemonSet pods that would run there, NodePools tried by
  ``weight`` (highest first), within ``spec.limits``;
- the launch takes the best offering left: reserved, then spot, then on-demand
  (docs concepts/nodepools.md), cheapest first; an offering the cloud refuses
  (InsufficientInstanceCapacity, ``capacity.insufficientCapacity``) is cached as
  unavailable for 3 minutes and the next one is launched (aws provider
  pkg/cache UnavailableOfferingsTTL; the fleet request falls back within the claim);
- the NodeClaim is created at once; its Node registers NotReady (taints
  ``node.kubernetes.io/not-ready:NoSchedule``, ``karpenter.sh/unregistered:NoExecute``,
  the NodePool's taints and startup taints; the NodePool's labels), Karpenter's
  registration then drops the unregistered taint and labels it ``karpenter.sh/registered``
  (pkg/controllers/nodeclaim/lifecycle/registration.go); it turns Ready after a launch-to-Ready time drawn
  uniformly from ``capacity.launchToReadySeconds`` (30-40 s, aws/karpenter-provider-aws#6165);
  it registers at two thirds of that time (a modelling choice: the kubelet is up before
  the CNI);
- pods packed onto a launching NodeClaim are nominated to it: they cause no other
  launch while it launches and for ``max(2 x BATCH_MAX_DURATION, 10 s)`` after it is
  Ready (pkg/controllers/state/statenode.go nominationWindow), while its node still has
  room for them: Karpenter simulates every batch's pending pods against each node's used
  capacity (pkg/controllers/provisioning/provisioner.go Schedule, "self-heal during the
  next scheduling loop when we launch a new node"), so a pod whose room another pod took
  once the node was Ready is launched for at the next batch.

Every request Karpenter sends (a NodeClaim's create, its status updates, the registration's
and initialization's Node patches; and the disruption controller's, :mod:`.consolidation`) waits
for one token bucket of ``karpenter.kubeClientQPS`` (200) and ``kubeClientBurst`` (300)
(pkg/operator/options/options.go; pkg/operator/operator.go sets them on the rest config of the
controller-runtime manager whose one client every controller is given). Reads are the
manager's cache's: not requests. The kubelet's writes (the Node's registration, Ready) are not
Karpenter's.

Every instance launched is billed from its launch (:mod:`spotguard_sim.billing`).
The controller does nothing (and costs nothing but a dictionary lookup per pod event)
while the cluster has no NodePool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from spotguard.policy import quantities

from spotguard_sim import billing, errors, nodepools, nodestatus, pods, scenario, scheduler
from spotguard_sim import capacity as capacity_mod
from spotguard_sim import settings as settings_mod
from spotguard_sim.controllers import base, drainer, ratelimit, termination

BATCH = ("batch",)
API = "karpenter.sh/v1"
REGISTERED = "karpenter.sh/registered"
INITIALIZED = "karpenter.sh/initialized"
# pkg/apis/v1/taints.go UnregisteredNoExecuteTaint
UNREGISTERED_TAINT = {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}
USER = {"username": "system:serviceaccount:kube-system:karpenter", "groups": [
    "system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}


def unschedulable(pod: dict[str, Any]) -> bool:
    """Pending and marked Unschedulable by the scheduler (what Karpenter's provisioner watches)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or status.get("phase", "Pending") != "Pending" or pods.is_terminating(pod):
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [])


@dataclasses.dataclass
class Launch:
    """A NodeClaim this provisioner launched, and what it packed onto it."""

    name: str
    node: str
    pool: dict[str, Any]
    offering: nodepools.Offering
    launched: float
    registers: float
    ready_at: float
    requests: Counter[str]
    pod_count: int
    ready: bool = False
    # A consolidation's replacement: the node it replaces. While that node's pods are on it,
    # they take their room on the claim (upstream's provisioner simulates the pods of nodes
    # marked for deletion with the pending ones: pkg/controllers/provisioning/provisioner.go,
    # ``GetPods`` with ``deletingNodePods``), so a pending pod does not count on that room.
    replaces: str = ""


class Provisioner(base.Controller):
    name = "karpenter"
    primary = ""
    resync_seconds = 10.0

    def __init__(self, store: Any, informer: base.Informer, *, capacity: capacity_mod.Capacity,
                 seed: int | None = 0, limits: settings_mod.KarpenterClient | None = None) -> None:
        super().__init__(store, informer)
        limits = limits or settings_mod.KarpenterClient()
        # the controller-runtime manager's client: shared with the disruption controller
        self.client = ratelimit.TokenBucket(self.clock, limits.kube_client_qps, limits.kube_client_burst)
        self.capacity = capacity
        self.ledger = billing.of(store)
        self.rng = random.Random(seed)
        self.started = self.clock.now()
        self._lock = threading.Lock()
        self._pools: set[str] = set()
        self._batch_start: float | None = None
        self._batch_last = 0.0
        self._nominated: dict[base.Key, str] = {}
        self._launches: dict[str, Launch] = {}
        self._unavailable: dict[tuple[str, str, str], float] = {}

    @property
    def has_pools(self) -> bool:
        return bool(self._pools)

    @property
    def nomination_window(self) -> float:
        return max(2 * self.capacity.batch_max, 10.0)

    # ---- notifications ----------------------------------------------------------

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodepools":
            name = str((obj.get("metadata") or {}).get("name") or "")
            with self._lock:
                if event_type == "DELETED":
                    self._pools.discard(name)
                else:
                    self._pools.add(name)
            return
        if not self._pools or resource != "pods" or event_type == "DELETED":
            return
        if unschedulable(obj) and not self._launching_for(base.key_of(obj)):
            self._arrive()

    def _arrive(self) -> None:
        now = self.clock.now()
        with self._lock:
            if self._batch_start is None:
                self._batch_start = now
            self._batch_last = now
        self.queue.add_after(BATCH, self.capacity.batch_idle)

    def resync(self) -> None:
        if not self._pools:
            for pool in self.informer.list("nodepools"):
                self._pools.add(str(pool["metadata"]["name"]))
        if not self._pools:
            return
        if any(unschedulable(p) and not self._is_nominated(base.key_of(p)) for p in self.informer.list("pods")):
            self._arrive()

    # ---- the work -----------------------------------------------------------------

    def sync(self, key: Any) -> None:
        if key == BATCH:
            self._batch()
        elif key[0] == "register":
            self._register(key[1])
        elif key[0] == "ready":
            self._ready(key[1])

    def _batch(self) -> None:
        now = self.clock.now()
        with self._lock:
            if self._batch_start is None:
                return
            closes = min(self._batch_last + self.capacity.batch_idle, self._batch_start + self.capacity.batch_max)
            if now + 1e-6 < closes:
                self.queue.add_after(BATCH, closes - now)
                return
            self._batch_start = None
        self.provision()

    def _launching_for(self, key: base.Key) -> bool:
        """The pod is nominated to a NodeClaim still launching (it waits for that node)."""
        launch = self._launches.get(self._nominated.get(key, ""))
        return launch is not None and not launch.ready

    def _room_taken(self) -> None:
        """Pods nominated to a NodeClaim that is Ready keep their nomination only while its node
        has room for them (largest first, beside the pods bound there): one whose room another
        pod took is pending like any other at the next batch."""
        waiting: dict[str, list[tuple[scheduler.PodInfo, base.Key]]] = {}
        for key, claim in list(self._nominated.items()):
            launch = self._launches.get(claim)
            pod = self.informer.get("pods", key)
            if launch is None or not launch.ready or pod is None or not unschedulable(pod):
                continue
            waiting.setdefault(claim, []).append((scheduler.PodInfo.from_pod(pod), key))
        self._recount_launching()
        for claim, infos in waiting.items():
            launch = self._launches.get(claim)
            node = self.informer.get("nodes", ("", launch.node)) if launch is not None else None
            if launch is None or node is None:
                continue
            info = scheduler.loaded(node, (p for p in self.informer.pods_on_node(launch.node)
                                           if not pods.is_terminating(p)))
            infos.sort(key=lambda x: (-x[0].requests.get("cpu", 0), -x[0].requests.get("memory", 0), x[1]))
            for pod_info, key in infos:
                if scheduler.first_fit(pod_info, [info]) is None:
                    self._nominated.pop(key, None)

    def _recount_launching(self) -> None:
        """What each NodeClaim still launching holds: the pods nominated to it that are still
        pending (one the scheduler bound elsewhere, or that is gone, no longer takes its room:
        Karpenter packs the pending pods anew every batch)."""
        loads: dict[str, tuple[Counter[str], int]] = {
            name: self._still_on(launch.replaces)
            for name, launch in list(self._launches.items()) if not launch.ready}
        for key, claim in list(self._nominated.items()):
            if claim not in loads:
                continue
            pod = self.informer.get("pods", key)
            if pod is None or (pod.get("spec") or {}).get("nodeName") or pods.is_terminating(pod):
                self._nominated.pop(key, None)
                continue
            requests, count = loads[claim]
            requests.update(scheduler.PodInfo.from_pod(pod).requests)
            loads[claim] = (requests, count + 1)
        for name, (requests, count) in loads.items():
            launch = self._launches.get(name)
            if launch is not None and not launch.ready:
                launch.requests, launch.pod_count = requests, count

    def _still_on(self, node: str) -> tuple[Counter[str], int]:
        """What the pods a drain would move off ``node`` request, and how many they are."""
        requests: Counter[str] = Counter()
        count = 0
        if node:
            for pod in self.informer.pods_on_node(node):
                if drainer.drainable(pod) and not pods.is_terminating(pod):
                    requests.update(scheduler.PodInfo.from_pod(pod).requests)
                    count += 1
        return requests, count

    def _is_nominated(self, key: base.Key) -> bool:
        claim = self._nominated.get(key)
        if claim is None:
            return False
        launch = self._launches.get(claim)
        if launch is None or (launch.ready and self.clock.now() > launch.ready_at + self.nomination_window):
            self._nominated.pop(key, None)
            return False
        return True

    def provision(self) -> list[str]:
        """One batch: pack the unschedulable pods and launch NodeClaims; their names."""
        pools = sorted((p for p in self.informer.list("nodepools") if self._class_found(p)),
                       key=lambda p: (-nodepools.weight(p), p["metadata"]["name"]))
        if not pools:
            return []
        self._room_taken()
        pending = [p for p in self.informer.list("pods")
                   if unschedulable(p) and not self._is_nominated(base.key_of(p))]
        if not pending:
            return []
        now = self.clock.now()
        self._unavailable = {k: v for k, v in self._unavailable.items() if v > now}
        infos = sorted(((scheduler.PodInfo.from_pod(p), base.key_of(p)) for p in pending),
                       key=lambda x: (-x[0].requests.get("cpu", 0), -x[0].requests.get("memory", 0), x[1]))
        daemons = nodepools.daemon_pods(self.informer.list("daemonsets"))
        offers = {p["metadata"]["name"]: nodepools.offerings(p, self.capacity.prices, self._unavailable)
                  for p in pools}
        claims: list[tuple[nodepools.Claim, list[base.Key]]] = []
        for pod, key in infos:
            for info in nodepools.relaxations(pod):
                if self._place(info, key, pools=pools, offers=offers, daemons=daemons, claims=claims):
                    break
        launched = []
        for claim, keys in claims:
            name = self._launch(claim, nominate=keys)
            if name is None:
                continue
            launched.append(name)
        return launched

    def claims(self) -> Callable[[scheduler.PodInfo], tuple[nodepools.Claim, list[nodepools.Offering]] | None]:
        """The new NodeClaim (and the offerings holding the pod) that the first NodePool, by
        weight, would make for a pod now; None where none would (a NodePool whose class exists,
        an offering not marked unavailable, within the pool's limits, room beside its
        DaemonSets): what Karpenter's scheduling simulation tries before it relaxes a pod's
        preferences. The pools, offerings and DaemonSets are read once, for every pod asked
        about (one consolidation simulation). Reads only (called from the disruption
        controller's thread)."""
        now = self.clock.now()
        unavailable = {k: v for k, v in dict(self._unavailable).items() if v > now}
        daemons = nodepools.daemon_pods(self.informer.list("daemonsets"))
        pools = [(pool, nodepools.offerings(pool, self.capacity.prices, unavailable),
                  self._pool_usage(pool["metadata"]["name"]))
                 for pool in sorted(self.informer.list("nodepools"),
                                    key=lambda p: (-nodepools.weight(p), p["metadata"]["name"]))
                 if self._class_found(pool, quiet=True)]

        def new_claim(pod: scheduler.PodInfo) -> tuple[nodepools.Claim, list[nodepools.Offering]] | None:
            for pool, offers, committed in pools:
                found = _new_claim(pool, pod, offers, committed, daemons)
                if found is not None:
                    return found
            return None

        return new_claim

    def simulation_inputs(self) -> tuple[list[scheduler.PodInfo], list[nodepools.InFlight]]:
        """What Karpenter's disruption simulation schedules beside a candidate's pods
        (kubernetes-sigs/karpenter pkg/controllers/disruption/helpers.go ``SimulateScheduling``:
        "start by getting all pending pods", and ``nodes.Active()`` holds the NodeClaims still
        launching): the pods pending for a node (marked Unschedulable) but those nominated to a
        NodeClaim still launching, whose room they take there, and those NodeClaims, each with
        what is packed onto it. Reads only (called from the disruption controller's thread)."""
        flights = [nodepools.InFlight(nodepools.candidate(launch.pool, launch.offering), Counter(launch.requests),
                                      launch.pod_count)
                   for launch in list(self._launches.values()) if not launch.ready]
        pending = [scheduler.PodInfo.from_pod(p) for p in self.informer.list("pods")
                   if unschedulable(p) and not self._launching_for(base.key_of(p))]
        return pending, flights

    def launch_replacement(self, claim: nodepools.Claim, node: str) -> str | None:
        """Launch a consolidation's replacement NodeClaim for ``node`` (its offerings already
        cheaper than the node); its name, or None where no offering could be launched."""
        name = self._launch(claim)
        launch = self._launches.get(name or "")
        if launch is not None:
            launch.replaces = node
        return name

    def initialized(self, claim: str) -> bool | None:
        """Whether a NodeClaim's node is up and initialized; None when the claim is gone."""
        launch = self._launches.get(claim)
        return None if launch is None else launch.ready

    def _class_found(self, pool: dict[str, Any], *, quiet: bool = False) -> bool:
        """A NodePool whose EC2NodeClass does not exist launches nothing (its NodeClassReady is False)."""
        ref = (nodepools.template(pool).get("spec") or {}).get("nodeClassRef") or {}
        if ref.get("kind", "EC2NodeClass") != "EC2NodeClass":
            return True
        try:
            self.store.get("ec2nodeclasses", str(ref.get("name") or ""))  # the manager's cache
        except errors.NotFound:
            if quiet:
                return False
            self.log.info("nodeclass not found: the NodePool launches nothing", extra={
                "nodepool": pool["metadata"]["name"], "nodeclass": ref.get("name")})
            return False
        return True

    def _place(self, info: scheduler.PodInfo, key: base.Key, *, pools: list[dict[str, Any]],
               offers: dict[str, list[nodepools.Offering]], daemons: list[scheduler.PodInfo],
               claims: list[tuple[nodepools.Claim, list[base.Key]]]) -> bool:
        """Room on a launching NodeClaim, then on a new claim of this batch, then a new claim."""
        if self._onto_launching(info, key):
            return True
        for claim, keys in claims:
            holding = claim.holding(info)
            if holding:
                claim.add(info, holding)
                keys.append(key)
                return True
        for pool in pools:
            committed = self._pool_usage(pool["metadata"]["name"])
            for other, _ in claims:
                if other.pool is pool and other.offerings:
                    committed.update(quantities.parse_resources(
                        max(other.offerings, key=lambda o: o.instance_type.vcpus).instance_type.capacity()))
            found = _new_claim(pool, info, offers[pool["metadata"]["name"]], committed, daemons)
            if found is not None:
                claim, holding = found
                claim.add(info, holding)
                claims.append((claim, [key]))
                return True
        return False

    def _onto_launching(self, info: scheduler.PodInfo, key: base.Key) -> bool:
        """Room on a NodeClaim still launching (Karpenter counts in-flight capacity)."""
        for launch in list(self._launches.values()):  # (forget() runs in the disruption thread)
            if launch.ready:
                continue
            node = nodepools.candidate(launch.pool, launch.offering)
            want = Counter(launch.requests)
            want.update(info.requests)
            if nodepools.admits(info, node) and nodepools.fits(want, launch.pod_count + 1, node):
                launch.requests = want
                launch.pod_count += 1
                self._nominated[key] = launch.name
                return True
        return False

    def _pool_usage(self, pool_name: str) -> Counter[str]:
        used: Counter[str] = Counter()
        for launch in list(self._launches.values()):  # (also read from the disruption thread)
            if launch.pool["metadata"]["name"] == pool_name:
                used.update(quantities.parse_resources(launch.offering.instance_type.capacity()))
        return used

    def _choose(self, claim: nodepools.Claim) -> nodepools.Offering | None:
        now = self.clock.now()
        elapsed = now - self.started
        pool_name = claim.pool["metadata"]["name"]
        used = self._pool_usage(pool_name)
        zones = Counter(launch.offering.zone for launch in list(self._launches.values())
                        if launch.pool["metadata"]["name"] == pool_name)
        left = list(claim.offerings)
        while left:
            best = left[0]
            same = [o for o in left if (o.capacity_type, o.price, o.instance_type.name)
                    == (best.capacity_type, best.price, best.instance_type.name)]
            same.sort(key=lambda o: (zones[o.zone], o.zone))
            for offering in same:
                left.remove(offering)
                if not nodepools.within_limits(claim.pool, used, offering):
                    continue
                if any(r.refuses(*offering.key, elapsed) for r in self.capacity.refusals):
                    self.log.info("insufficient capacity: offering unavailable", extra={
                        "offering": "/".join(offering.key)})
                    self._unavailable[offering.key] = now + self.capacity.unavailable_ttl
                    continue
                return offering
        return None

    def _launch(self, claim: nodepools.Claim, nominate: Iterable[base.Key] = ()) -> str | None:
        """Create a NodeClaim for ``claim`` and nominate ``nominate`` to it, before the claim
        counts as launching: the disruption controller's thread reads the two together
        (:meth:`simulation_inputs`), and a pod it saw both pending and in a claim's room was
        counted twice (a test caught it once under load)."""
        offering = self._choose(claim)
        pool = claim.pool
        pool_name = pool["metadata"]["name"]
        if offering is None:
            self.log.info("no offering could be launched", extra={"nodepool": pool_name})
            return None
        suffix = "".join(self.rng.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        name = f"{pool_name}-{suffix}"
        node_name = f"ip-{nodestatus.internal_ip(name).replace('.', '-')}.ec2.internal"
        now = self.clock.now()
        low, high = self.capacity.launch_to_ready
        to_ready = self.rng.uniform(low, high)
        t = offering.instance_type
        labels = nodepools.node_labels(pool, offering, node_name)
        node_class = ((nodepools.template(pool).get("spec") or {}).get("nodeClassRef") or {})
        requirements = [*nodepools.requirements(pool),
                        {"key": nodepools.INSTANCE_TYPE, "operator": "In", "values": [t.name]},
                        {"key": nodepools.CAPACITY_TYPE, "operator": "In", "values": [offering.capacity_type]},
                        {"key": nodepools.ZONE, "operator": "In", "values": [offering.zone]}]
        total = claim.total({})
        obj = {
            "apiVersion": API, "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {k: v for k, v in labels.items() if k != "kubernetes.io/hostname"},
                         "annotations": {"karpenter.sh/nodepool-hash-version": "v3"},
                         "ownerReferences": [{"apiVersion": API, "kind": "NodePool", "name": pool_name,
                                              "uid": pool["metadata"].get("uid", ""), "blockOwnerDeletion": True}]},
            "spec": {"nodeClassRef": dict(node_class), "requirements": requirements,
                     "resources": {"requests": {k: (f"{v}m" if k == "cpu" else str(v)) for k, v in total.items()}},
                     "taints": nodepools.taints(pool), "startupTaints": nodepools.startup_taints(pool),
                     "expireAfter": (nodepools.template(pool).get("spec") or {}).get("expireAfter", "720h")},
        }
        try:
            self.request()
            created = self.store.create("nodeclaims", obj)
        except errors.StatusError as exc:
            self.log.warning("creating the NodeClaim failed", extra={"nodeclaim": name, "error": str(exc)})
            return None
        provider_id = f"aws:///{offering.zone}/{scenario.instance_id(name)}"
        iso = self.clock.iso()

        def launched(o: dict[str, Any]) -> None:
            o["status"] = {"providerID": provider_id, "imageID": "ami-0sim0al2023", "capacity": t.capacity(),
                           "allocatable": t.allocatable(),
                           "conditions": [_cond("Launched", "True", iso), _cond("Registered", "Unknown", iso),
                                          _cond("Initialized", "Unknown", iso), _cond("Ready", "Unknown", iso)]}

        with contextlib.suppress(errors.NotFound):
            self.request()
            self.store.mutate("nodeclaims", name, None, launched)
        self.ledger.launch(node_name, t.name, offering.capacity_type, now)
        for key in nominate:
            self._nominated[key] = name
        self._launches[name] = Launch(name, node_name, pool, offering, now, now + to_ready * 2 / 3, now + to_ready,
                                      total - claim.overhead, len(claim.pods))
        self.event(created, "Normal", "Launched",
                   f"Status condition transitioned, Type: Launched, Status: True ({t.name}, "
                   f"{offering.capacity_type}, {offering.zone})")
        self.log.info("launched nodeclaim", extra={"nodeclaim": name, "instance-type": t.name,
                                                    "capacity-type": offering.capacity_type, "zone": offering.zone,
                                                    "pods": len(claim.pods)})
        self.queue.add_after(("register", name), to_ready * 2 / 3)
        self.queue.add_after(("ready", name), to_ready)
        return name

    def _register(self, claim: str) -> None:
        launch = self._launches.get(claim)
        if launch is None:
            return
        t = launch.offering.instance_type
        labels = nodepools.node_labels(launch.pool, launch.offering, launch.node)
        # the kubelet registers with the NodeClaim's taints and Karpenter's unregistered taint
        # (the provider's user data passes them: --register-with-taints)
        taints = [*nodepools.taints(launch.pool), *nodepools.startup_taints(launch.pool), dict(UNREGISTERED_TAINT)]
        iso = self.clock.iso()
        try:
            owner = self.store.get("nodeclaims", claim)  # the manager's cache
        except errors.NotFound:
            return
        node = termination.registering(
            launch.node, labels, taints, instance_type=t,
            provider_id=f"aws:///{launch.offering.zone}/{scenario.instance_id(claim)}", iso=iso,
            owners=[{"apiVersion": API, "kind": "NodeClaim", "name": claim, "uid": owner["metadata"]["uid"],
                     "blockOwnerDeletion": True}])
        with contextlib.suppress(errors.AlreadyExists):
            self.store.create("nodes", node)  # the kubelet's registration, not Karpenter's request

        def register_node(n: dict[str, Any]) -> None:
            # registration.go: sync the NodeClaim's taints, drop the unregistered taint, label it registered
            spec = n.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != UNREGISTERED_TAINT["key"]]
            n["metadata"].setdefault("labels", {})[REGISTERED] = "true"

        try:
            self.request()
            self.store.mutate("nodes", launch.node, None, register_node)
        except errors.NotFound:
            return

        def registered(o: dict[str, Any]) -> None:
            o.setdefault("status", {})["nodeName"] = launch.node
            _set(o, "Registered", "True", iso)

        with contextlib.suppress(errors.NotFound):
            self.request()
            self.store.mutate("nodeclaims", claim, None, registered)

    def _ready(self, claim: str) -> None:
        launch = self._launches.get(claim)
        if launch is None:
            return
        iso = self.clock.iso()

        def ready(node: dict[str, Any]) -> None:
            termination.ready(node, iso)
            node["metadata"].setdefault("labels", {})[INITIALIZED] = "true"

        try:
            # the kubelet posts Ready; the initialization controller's label is Karpenter's request
            self.request()
            self.store.mutate("nodes", launch.node, None, ready)
        except errors.NotFound:
            return
        launch.ready = True
        launch.ready_at = self.clock.now()

        def initialized(o: dict[str, Any]) -> None:
            _set(o, "Initialized", "True", iso)
            _set(o, "Ready", "True", iso)

        with contextlib.suppress(errors.NotFound):
            self.request()
            self.store.mutate("nodeclaims", claim, None, initialized)

    def forget(self, claim: str) -> None:
        """A NodeClaim is gone (consolidated, interrupted): its room and nominations with it."""
        self._launches.pop(claim, None)
        for key in [k for k, v in list(self._nominated.items()) if v == claim]:
            self._nominated.pop(key, None)


def _new_claim(pool: dict[str, Any], pod: scheduler.PodInfo, offers: list[nodepools.Offering],
               committed: Counter[str], daemons: list[scheduler.PodInfo],
               ) -> tuple[nodepools.Claim, list[nodepools.Offering]] | None:
    """A new claim of ``pool`` for ``pod`` and the offerings that would hold it (the pool's
    ``offers`` within its limits beside what is ``committed``, room beside its DaemonSets);
    None when none would."""
    usable = [o for o in offers
              if nodepools.within_limits(pool, committed, o) and nodepools.admits(pod, nodepools.candidate(pool, o))]
    if not usable:
        return None
    overhead, count = nodepools.daemon_overhead(nodepools.candidate(pool, usable[0]), daemons)
    claim = nodepools.Claim(pool, usable, overhead=overhead, overhead_pods=count)
    holding = claim.holding(pod)
    return (claim, holding) if holding else None


def _cond(type_: str, status: str, iso: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": type_ if status == "True" else "AwaitingReconciliation",
            "message": "", "lastTransitionTime": iso}


def _set(obj: dict[str, Any], type_: str, status: str, iso: str) -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c.get("type") == type_:
            c.update(_cond(type_, status, iso))
            return
    conds.append(_cond(type_, status, iso))
