"""Karpenter's disruption: consolidation of empty and under-used nodes, and spot
interruption handling, then the termination of the node (taint, drain, terminate).

As kubernetes-sigs/karpenter does it (sources in docs/sim.md):
- the disruption controller polls every 10 s (pkg/controllers/disruption/controller.go
  ``pollingPeriod``); a node is a candidate once ``consolidateAfter`` (default ``0s``)
  has passed since the last pod event on it (pkg/apis/v1/nodepool.go);
- ``consolidationPolicy: WhenEmpty`` removes nodes with no pods but DaemonSet pods;
  ``WhenEmptyOrUnderutilized`` (the default) also removes a node whose pods all fit on
  the other nodes (delete consolidation), or replaces it by one cheaper node where its
  pods need exactly one new NodeClaim (single-node replace consolidation,
  pkg/controllers/disruption/consolidation.go ``computeConsolidation``: the replacement's
  instance types are those cheaper than the node, ``RemoveInstanceTypeOptionsByPriceAndMinValues``;
  a replacement that could be spot or on-demand is made spot; a spot node is never
  replaced, ``SpotToSpotConsolidation`` being off by default). As upstream's queue does
  (pkg/controllers/disruption/queue.go ``StartCommand``, ``waitOrTerminate``), the node is
  tainted first, the replacement launched, and the node drained once the replacement is
  initialized; a replacement that fails to launch or is lost abandons the command and
  untaints the node. Multi-node consolidation is not modelled;
- a decision is carried out only after ``commandValidationDelay`` (15 s,
  pkg/controllers/disruption/consolidation.go; emptiness.go and
  singlenodeconsolidation.go wait it too), and only if the node is still a
  candidate then: no pod event on it since, and (Underutilized) its pods
  still fit elsewhere. The node counts against the budget meanwhile;
- ``disruption.budgets`` (default ``nodes: 10%``, rounded up) bound how many of a
  NodePool's nodes are disrupted at once; budgets with a ``schedule`` are taken as
  always active (harsher), ``reasons`` are honoured (Empty, Underutilized);
- a node annotated ``karpenter.sh/do-not-disrupt: "true"`` is not consolidated
  (``pkg/controllers/state/statenode.go`` ValidateNodeDisruptable), nor is a node with an
  active pod so annotated: any pod on it, DaemonSet and mirror pods included, that is
  neither terminal nor terminating, with the value ``"true"`` or a duration (``"5m"``) not
  yet elapsed since the pod started (``ValidatePodsDisruptable``,
  ``pkg/utils/pod/scheduling.go`` IsDisruptable and IsDoNotDisruptActive; an invalid
  value counts as absent); a node whose pods' PodDisruptionBudgets allow too few
  disruptions is not consolidated either; and the termination never evicts such a pod
  (``IsEvictable``): it waits for it to be gone (``IsDrainable``);
- termination taints the node ``karpenter.sh/disrupted:NoSchedule``, evicts its pods
  through the Eviction API (PodDisruptionBudgets answer 429: retried), waits for them to
  be gone, then terminates the instance and deletes the NodeClaim and the Node
  (pkg/controllers/node/termination);
- with ``capacity.interruptionHandling`` (Karpenter's interruption queue configured),
  a spot interruption notice starts that termination at once
  (pkg/controllers/interruption: "cordon and drain ... before the node is reclaimed").

Its requests (the taint and its removal, each eviction, the NodeClaim's and the Node's
DELETE, a NodePool's or an EC2NodeClass's status update where it changes) wait for the one
token bucket it shares with the provisioner (:mod:`.provisioner`: the controller-runtime
manager's client, ``karpenter.kubeClientQPS``/``kubeClientBurst``). Its events go through the
manager's event recorder, whose client has a bucket of its own: not counted here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from spotguard.policy import quantities

from spotguard_sim import capacity as capacity_mod
from spotguard_sim import clock as simclock
from spotguard_sim import cloud as cloud_mod
from spotguard_sim import disruption, errors, nodepools, pods, scheduler
from spotguard_sim.controllers import base, drainer, instances, provisioner, termination

POLL = ("poll",)
DISRUPTED_TAINT = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
RETRY_SECONDS = 5.0
VALIDATION_SECONDS = 15.0  # commandValidationDelay (pkg/controllers/disruption/consolidation.go)
_DURATION = re.compile(r"(\d+)(h|m|s)")
_WHOLE_DURATION = re.compile(r"(?:\d+(?:h|m|s))+")


def parse_duration(raw: Any) -> float | None:
    """A Go duration ("30s", "1h30m"); None for ``Never``."""
    text = str(raw if raw is not None else "0s")
    if text == "Never":
        return None
    return float(sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in _DURATION.findall(text)))


def allowed_disruptions(pool: dict[str, Any], reason: str, total: int) -> int:
    """The fewest nodes any active budget that covers ``reason`` allows (percentages round up)."""
    budgets = ((pool.get("spec") or {}).get("disruption") or {}).get("budgets") or [{"nodes": "10%"}]
    allowed = total
    for budget in budgets:
        reasons = budget.get("reasons")
        if reasons and reason not in reasons:
            continue
        raw = str(budget.get("nodes", "10%"))
        value = math.ceil(total * float(raw[:-1]) / 100) if raw.endswith("%") else int(raw)
        allowed = min(allowed, value)
    return allowed


def _annotated(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(DO_NOT_DISRUPT) == "true"


def do_not_disrupt(pod: dict[str, Any], now: float) -> bool:
    """``IsDoNotDisruptActive`` for an active pod: ``"true"``, or a duration not yet elapsed
    since the pod's ``status.startTime`` (no start time: active)."""
    if pods.is_terminating(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(DO_NOT_DISRUPT)
    if value is None:
        return False
    if value == "true":
        return True
    if not _WHOLE_DURATION.fullmatch(str(value)):
        return False  # invalid: as if absent
    started = (pod.get("status") or {}).get("startTime")
    if not started:
        return True
    try:
        return now - simclock.parse_iso(str(started)) < (parse_duration(value) or 0.0)
    except ValueError:
        return True


class Disruption(base.Controller):
    name = "karpenter-disruption"
    primary = ""
    resync_seconds = capacity_mod.DISRUPTION_POLL

    def __init__(self, store: Any, informer: base.Informer, *, capacity: capacity_mod.Capacity,
                 owner: provisioner.Provisioner) -> None:
        super().__init__(store, informer)
        self.capacity = capacity
        self.resync_seconds = capacity.disruption_poll
        self.owner = owner
        self.client = owner.client  # one client for all of Karpenter's controllers
        self.cloud = cloud_mod.of(store)
        self._last_pod_event: dict[str, float] = {}
        self._disrupting: dict[str, str] = {}  # node -> reason
        self._validating: dict[str, float] = {}  # node -> when consolidation chose it
        self._replacing: dict[str, str] = {}  # node -> the NodeClaim launched to replace it
        self._polling = False

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if not self.owner.has_pools:
            return
        if resource == "pods":
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                self._last_pod_event[node] = self.clock.now()
        elif resource == "nodes":
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if nodepools.NODEPOOL not in labels:
                return
            name = str(obj["metadata"]["name"])
            if event_type == "DELETED":
                self.queue.add(("gone", name, _claim_of(obj)))
            elif (self.capacity.interruption_handling and instances.terminate_at(obj) is not None
                  and name not in self._disrupting):
                self.queue.add(("interrupt", name))

    def resync(self) -> None:
        if self.owner.has_pools and not self._polling:
            self._polling = True
            self.queue.add(POLL)

    def sync(self, key: Any) -> None:
        if key == POLL:
            try:
                self._consolidate()
                self._report()
            finally:
                self.queue.add_after(POLL, self.capacity.disruption_poll)
        elif key[0] == "interrupt":
            node = self.informer.get("nodes", ("", key[1]))
            if node is not None and key[1] not in self._disrupting:
                self._disrupt(node, "Interrupted")
        elif key[0] == "validate":
            self._validate(key[1], key[2])
        elif key[0] == "replaced":
            self._await_replacement(key[1])
        elif key[0] == "drain":
            self._drain(key[1])
        elif key[0] == "gone":
            self._disrupting.pop(key[1], None)
            self._validating.pop(key[1], None)
            self._replacing.pop(key[1], None)
            self._last_pod_event.pop(key[1], None)
            if key[2]:
                if self.informer.get("nodeclaims", ("", key[2])) is not None:  # (not deleted yet)
                    with contextlib.suppress(errors.NotFound):
                        self.request()
                        self.store.delete("nodeclaims", key[2])
                self.owner.forget(key[2])

    # ---- consolidation -----------------------------------------------------------

    def _consolidate(self) -> None:
        now = self.clock.now()
        pools = {p["metadata"]["name"]: p for p in self.informer.list("nodepools")}
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for node in self.informer.list("nodes"):
            owner = str(((node.get("metadata") or {}).get("labels") or {}).get(nodepools.NODEPOOL) or "")
            if owner in pools:
                by_pool.setdefault(owner, []).append(node)
        underutilized_done = False
        for name, members in sorted(by_pool.items()):
            pool = pools[name]
            disruption_spec = (pool.get("spec") or {}).get("disruption") or {}
            policy = disruption_spec.get("consolidationPolicy", "WhenEmptyOrUnderutilized")
            after = parse_duration(disruption_spec.get("consolidateAfter", "0s"))
            if after is None:
                continue
            busy = sum(1 for n in members
                       if n["metadata"]["name"] in self._disrupting or n["metadata"]["name"] in self._validating)
            room = {"Empty": allowed_disruptions(pool, "Empty", len(members)) - busy,
                    "Underutilized": allowed_disruptions(pool, "Underutilized", len(members)) - busy}
            candidates = []
            for node in members:
                node_name = node["metadata"]["name"]
                if (node_name in self._disrupting or node_name in self._validating or _annotated(node)
                        or not scheduler.node_ready(node)):
                    continue
                if any(do_not_disrupt(p, now) for p in self.informer.pods_on_node(node_name)):
                    continue
                if ((node.get("metadata") or {}).get("labels") or {}).get(provisioner.INITIALIZED) != "true":
                    continue
                since = max(self._last_pod_event.get(node_name, 0.0), _ready_since(node))
                if now - since < after:
                    continue
                candidates.append((len(workload_pods(self.informer, node_name)), node_name, node))
            inputs = None
            for count, node_name, _node in sorted(candidates, key=lambda c: (c[0], c[1])):
                if count and inputs is None and not underutilized_done:
                    inputs = self.owner.simulation_inputs()
                if count == 0 and min(room.values()) > 0 and room["Empty"] > 0:
                    self._choose(node_name, "Empty", now)
                    room = {k: v - 1 for k, v in room.items()}
                elif (count and policy == "WhenEmptyOrUnderutilized" and not underutilized_done
                      and room["Underutilized"] > 0
                      and self._compute(_node, inputs).outcome is not Outcome.NONE):
                    self._choose(node_name, "Underutilized", now)
                    room = {k: v - 1 for k, v in room.items()}
                    underutilized_done = True

    def _choose(self, node_name: str, reason: str, now: float) -> None:
        """Consolidation chose the node: it is disrupted once the command validates, 15 s later."""
        self._validating[node_name] = now
        self.queue.add_after(("validate", node_name, reason), VALIDATION_SECONDS)

    def _validate(self, node_name: str, reason: str) -> None:
        chosen = self._validating.pop(node_name, None)
        node = self.informer.get("nodes", ("", node_name))
        if chosen is None or node is None or node_name in self._disrupting or _annotated(node):
            return
        if self._last_pod_event.get(node_name, 0.0) > chosen or not scheduler.node_ready(node):
            return  # no longer a candidate: the next poll decides again
        count = len(workload_pods(self.informer, node_name))
        if reason == "Empty" and count:
            return
        replacement = None
        if reason == "Underutilized" and count:
            decision = self._compute(node)
            if decision.outcome is Outcome.NONE:
                return  # its pods no longer fit elsewhere, nor on one cheaper NodeClaim
            replacement = decision.claim  # None: a delete
        self._disrupt(node, reason, replacement=replacement)

    def _report(self) -> None:
        """NodePool and EC2NodeClass status: node counts, resources, Ready (as Karpenter's own controllers)."""
        iso = self.clock.iso()
        counts: Counter[str] = Counter()
        totals: dict[str, Counter[str]] = {}
        for node in self.informer.list("nodes"):
            owner = str(((node.get("metadata") or {}).get("labels") or {}).get(nodepools.NODEPOOL) or "")
            if owner:
                counts[owner] += 1
                totals.setdefault(owner, Counter()).update(
                    quantities.parse_resources((node.get("status") or {}).get("capacity") or {}))
        for pool in self.informer.list("nodepools"):
            name = pool["metadata"]["name"]
            used = totals.get(name, Counter())
            resources = {k: (f"{v}m" if k == "cpu" and v % 1000 else str(v // 1000 if k == "cpu" else v))
                         for k, v in sorted(used.items())}

            def status(obj: dict[str, Any], n: int = counts[name], r: dict[str, str] = resources) -> None:
                st = obj.setdefault("status", {})
                st["nodes"] = n
                st["resources"] = r
                conds = st.setdefault("conditions", [])
                if not any(c.get("type") == "Ready" for c in conds):
                    conds.append({"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                  "lastTransitionTime": iso})

            with contextlib.suppress(errors.NotFound):
                self.write("nodepools", name, None, status)  # only where it changes, as upstream's
        for node_class in self.store.list("ec2nodeclasses")[0]:  # (the manager's cache)
            if (node_class.get("status") or {}).get("conditions"):
                continue

            def ready(obj: dict[str, Any]) -> None:
                obj.setdefault("status", {})["conditions"] = [
                    {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": iso}]

            with contextlib.suppress(errors.NotFound):
                self.write("ec2nodeclasses", node_class["metadata"]["name"], None, ready)

    def _compute(self, node: dict[str, Any],
                 inputs: tuple[list[scheduler.PodInfo], list[nodepools.InFlight]] | None = None) -> Consolidation:
        """The one consolidation simulation of a candidate (:func:`compute_consolidation`), beside
        the pending pods and the NodeClaims still launching (``inputs``: read once a poll)."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        capacity_type = str(labels.get(nodepools.CAPACITY_TYPE) or "")
        price = self.capacity.prices.hourly(str(labels.get(nodepools.INSTANCE_TYPE) or ""), capacity_type)
        now = self.clock.now()
        pending, in_flight = inputs if inputs is not None else self.owner.simulation_inputs()
        return compute_consolidation(self.store, self.informer, node["metadata"]["name"], set(self._disrupting),
                                     blocks=lambda p: do_not_disrupt(p, now), new_claim=self.owner.claims(),
                                     price=price, spot=capacity_type == "spot", pending=pending,
                                     in_flight=in_flight)

    def _await_replacement(self, name: str) -> None:
        """The replacement of a node being replaced is up: drain the node; lost: give the node back."""
        claim = self._replacing.get(name)
        if claim is None or name not in self._disrupting:
            return
        up = self.owner.initialized(claim)
        if up is None:
            self.log.info("replacement lost: the node is left as it was", extra={"node": name, "nodeclaim": claim})
            self._undisrupt(name)
            return
        if not up:
            self.queue.add_after(("replaced", name), RETRY_SECONDS)
            return
        self._replacing.pop(name, None)
        self.queue.add(("drain", name))

    def _undisrupt(self, name: str) -> None:
        self._disrupting.pop(name, None)
        self._replacing.pop(name, None)

        def untaint(obj: dict[str, Any]) -> None:
            spec = obj.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != DISRUPTED_TAINT["key"]]

        with contextlib.suppress(errors.NotFound):
            self.write("nodes", name, None, untaint)

    # ---- termination -------------------------------------------------------------

    def _disrupt(self, node: dict[str, Any], reason: str, *, replacement: nodepools.Claim | None = None) -> None:
        name = node["metadata"]["name"]
        self._disrupting[name] = reason
        self.log.info("disrupting node", extra={"node": name, "reason": reason,
                                                "replace": replacement is not None})
        self.event(node, "Normal", "DisruptionTerminating", f"Disrupting Node: {reason}")
        iso = self.clock.iso()

        def taint(obj: dict[str, Any]) -> None:
            taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") != DISRUPTED_TAINT["key"]]
            obj.setdefault("spec", {})["taints"] = [*taints, {**DISRUPTED_TAINT, "timeAdded": iso}]

        try:
            self.write("nodes", name, None, taint)
        except errors.NotFound:
            self._disrupting.pop(name, None)
            return
        if replacement is None:
            self.queue.add(("drain", name))
            return
        # tainted first, then the replacement launched; drained once it is initialized
        claim = self.owner.launch_replacement(replacement, name)
        if claim is None:
            self.log.info("replacement not launched: the node is left as it was", extra={"node": name})
            self._undisrupt(name)
            return
        self._replacing[name] = claim
        self.queue.add_after(("replaced", name), RETRY_SECONDS)

    def _drain(self, name: str) -> None:
        node = self.informer.get("nodes", ("", name))
        if node is None or name not in self._disrupting:
            return
        now = self.clock.now()
        left, refused = termination.drain(self.store, self.informer, name, provisioner.USER,
                                          keep=lambda p: do_not_disrupt(p, now), request=self.request)
        if left:
            # evicted pods are waited for until they are gone; a refused eviction is tried again
            self.queue.add_after(("drain", name), RETRY_SECONDS if refused else 1.0)
            return
        self.log.info("node drained: terminating its instance", extra={"node": name})
        claim = _claim_of(node)
        if claim:
            with contextlib.suppress(errors.NotFound):
                self.request()
                self.store.delete("nodeclaims", claim)
            self.owner.forget(claim)
        self.request()  # the Node's DELETE
        termination.terminate(self.store, name)


def _claim_of(node: dict[str, Any]) -> str:
    for ref in (node.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "NodeClaim":
            return str(ref.get("name") or "")
    return ""


def _ready_since(node: dict[str, Any]) -> float:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("lastTransitionTime"):
            with contextlib.suppress(ValueError):
                return simclock.parse_iso(str(cond["lastTransitionTime"]))
    return 0.0


def workload_pods(informer: base.Informer, node: str) -> list[dict[str, Any]]:
    """The pods a drain would move off ``node``: not DaemonSet or mirror pods, not terminating, not finished."""
    return [p for p in informer.pods_on_node(node) if drainer.drainable(p)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def can_move(store: Any, informer: base.Informer, node_name: str, leaving: set[str], *,
             blocks: Callable[[dict[str, Any]], bool],
             pods_on: Callable[[str], list[dict[str, Any]]] | None = None) -> bool:
    """Every pod on the node may be disrupted (none ``blocks``, their budgets allow it) and fits
    on another Ready, schedulable node that is not ``leaving``: the Cluster Autoscaler's
    simulation, with the scheduler's filters (preferences do not hold a pod anywhere), over
    ``pods_on`` (what its snapshot holds on a node; every pod bound there by default).
    Karpenter's is :func:`compute_consolidation`."""
    moving = workload_pods(informer, node_name)
    if pods_on is not None:
        kept = {base.key_of(p) for p in pods_on(node_name)}
        moving = [p for p in moving if base.key_of(p) in kept]
    if not _disruptable(store, moving, blocks):
        return False
    others = _others(informer, node_name, leaving, pods_on)
    return all(scheduler.first_fit(info, others) is not None for info in _heaviest_first(moving))


def _heaviest_first(moving: list[dict[str, Any]]) -> list[scheduler.PodInfo]:
    return sorted(_pod_infos(moving), key=lambda i: -i.requests.get("cpu", 0))


def _pod_infos(pod_objs: Iterable[dict[str, Any]]) -> list[scheduler.PodInfo]:
    return [scheduler.PodInfo.from_pod(p) for p in pod_objs]


# whose pod a consolidation simulation schedules: the candidate's, a node's being disrupted, a pending one
_OWN, _DELETING, _PENDING = "own", "deleting", "pending"


def _disruptable(store: Any, moving: list[dict[str, Any]], blocks: Callable[[dict[str, Any]], bool]) -> bool:
    """No pod ``blocks`` it, and their PodDisruptionBudgets allow them all to go."""
    if any(blocks(p) for p in moving):
        return False
    per_budget: Counter[str] = Counter()
    for pod in moving:
        budgets = disruption.matching_pdbs(store, pod)
        if len(budgets) > 1:
            return False
        for b in budgets:
            key = f"{b['metadata']['namespace']}/{b['metadata']['name']}"
            per_budget[key] += 1
            if int((b.get("status") or {}).get("disruptionsAllowed") or 0) < per_budget[key]:
                return False
    return True


def _others(informer: base.Informer, node_name: str, leaving: set[str],
            pods_on: Callable[[str], list[dict[str, Any]]] | None = None) -> list[scheduler.NodeInfo]:
    """The Ready, schedulable nodes that stay, with what their pods request."""
    on = pods_on or informer.pods_on_node
    others = []
    for node in informer.list("nodes"):
        name = node["metadata"]["name"]
        if name == node_name or name in leaving or not scheduler.node_ready(node):
            continue
        if (node.get("spec") or {}).get("unschedulable") or instances.terminate_at(node) is not None:
            continue
        others.append(scheduler.loaded(node, (p for p in on(name) if not pods.is_terminating(p))))
    return others


class Outcome(enum.Enum):
    """What single-node consolidation would do with a node."""

    DELETE = "delete"  # its pods all fit on the other nodes
    REPLACE = "replace"  # its pods need exactly one new, cheaper NodeClaim
    NONE = "none"  # neither


@dataclasses.dataclass(frozen=True)
class Consolidation:
    """The result of :func:`compute_consolidation`: the outcome, why, and (``REPLACE`` only)
    the replacement NodeClaim, its offerings already cut to those cheaper than the node."""

    outcome: Outcome
    reason: str
    claim: nodepools.Claim | None = None


def compute_consolidation(store: Any, informer: base.Informer, node_name: str, leaving: set[str], *,
                          blocks: Callable[[dict[str, Any]], bool],
                          new_claim: Callable[[scheduler.PodInfo],
                                              tuple[nodepools.Claim, list[nodepools.Offering]] | None],
                          price: float | None, spot: bool,
                          pending: Sequence[scheduler.PodInfo] = (),
                          in_flight: Sequence[nodepools.InFlight] = ()) -> Consolidation:
    """Karpenter's single-node consolidation of a node: ONE scheduling simulation of its pods
    on the other nodes plus possibly new NodeClaims, as upstream's ``computeConsolidation``
    (kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go, read at commit
    2266468104f36373ed002241afaee2d3bbc26078): no new claim is a delete, exactly one a
    replace, anything else nothing.

    Every pod must be disruptable (none ``blocks``, their PodDisruptionBudgets allow them all
    to go). As upstream's ``SimulateScheduling`` (pkg/controllers/disruption/helpers.go), the
    simulation schedules the node's pods together with the pods pending for a node
    (``pending``: "start by getting all pending pods") and the pods of the nodes already
    being disrupted (``leaving``), heaviest first (CPU, then memory: ``byCPUAndMemoryDescending``),
    each as Karpenter's scheduler tries it (``Scheduler.add`` then ``Preferences.Relax``;
    default ``PREFERENCE_POLICY=Respect``): its forms, strictest first
    (:func:`nodepools.relaxations`: its heaviest preferred node affinity term required first),
    go to another Ready, schedulable node that is not ``leaving``, else to a NodeClaim still
    launching (``in_flight``; initialized nodes are tried first, ``sortExistingNodes``), else to
    the NodeClaim already planned, else to a new one (``new_claim``), else the pod is relaxed.
    A form that no other node takes but a new NodeClaim could is placed there, not relaxed: so
    a pod that prefers spot stays on its spot node rather than moving into on-demand room.
    A second new NodeClaim ends the simulation ("Can't remove without creating 2
    candidates"), whoever's pods need it: pending pods that need a node launched hold every
    delete (the room the node's pods would take is the room they wait for). A pod of the
    node or of a node being disrupted that fits nowhere ends it too, as does one of the
    node's pods that would go to a NodeClaim still launching (upstream's
    ``UninitializedNodeError``); a pending pod that fits nowhere is left out
    (``AllNonPendingPodsScheduled``).

    A replacement's offerings are cut to those cheaper than the node (``price``; None: the
    node has no price, so no replace), made spot where it could be spot or on-demand, and a
    spot node (``spot``) is never replaced by a spot one (``SpotToSpotConsolidation`` is off
    by default)."""
    moving = workload_pods(informer, node_name)
    if not _disruptable(store, moving, blocks):
        return Consolidation(Outcome.NONE, "a pod may not be disrupted (do-not-disrupt or its budget)")
    others = _others(informer, node_name, leaving)
    flights = [nodepools.InFlight(f.node, Counter(f.requests), f.pods) for f in in_flight]
    queue = [(info, _OWN) for info in _pod_infos(moving)]
    queue += [(info, _DELETING) for name in sorted(leaving) if name != node_name
              for info in _pod_infos(p for p in workload_pods(informer, name) if not pods.is_terminating(p))]
    queue += [(info, _PENDING) for info in pending]
    queue.sort(key=lambda q: (-q[0].requests.get("cpu", 0), -q[0].requests.get("memory", 0)))
    claim: nodepools.Claim | None = None
    for info, whose in queue:
        for form in nodepools.relaxations(info):
            if scheduler.first_fit(form, others) is not None:
                break
            if any(f.take(form) for f in flights):
                if whose == _OWN:
                    return Consolidation(Outcome.NONE, f"pod {info.namespace}/{info.name} would go to a node "
                                                       "still launching (not initialized)")
                break
            if claim is not None and (holding := claim.holding(form)):
                claim.add(form, holding)
                break
            found = new_claim(form)
            if found is not None:
                if claim is not None:
                    return Consolidation(Outcome.NONE, "Can't remove without creating 2 candidates")
                claim, holding = found
                claim.add(form, holding)
                break
        else:
            if whose == _PENDING:
                continue
            return Consolidation(Outcome.NONE, f"pod {info.namespace}/{info.name} fits on no other node "
                                               "and on no new NodeClaim")
    if claim is None:
        return Consolidation(Outcome.DELETE, "every pod fits on the other nodes")
    if price is None:
        return Consolidation(Outcome.NONE, "the node has no price to replace it by a cheaper one")
    offers = claim.offerings
    kinds = {o.capacity_type for o in offers}
    if spot and "spot" in kinds:
        return Consolidation(Outcome.NONE,
                             "SpotToSpotConsolidation is disabled, can't replace a spot node with a spot node")
    if "spot" in kinds and "on-demand" in kinds:
        offers = [o for o in offers if o.capacity_type == "spot"]
    offers = [o for o in offers if o.price < price]
    if not offers:
        return Consolidation(Outcome.NONE, "Can't replace with a cheaper node")
    claim.offerings = offers
    return Consolidation(Outcome.REPLACE, "its pods need one new, cheaper NodeClaim", claim)
