"""One full interruption cycle on the simulated cluster, wired as in production.

1. The cluster starts with the scenario's nodes; the admission webhook
   (HTTPS, a child process), the spot-interruption poller (on moto's SQS queue,
   fed by moto's EventBridge rule) and node-added are started; the workloads are
   applied and every pod placed by the webhook and Ready.
2. The notice: EC2 emits an interruption warning for every doomed node at once
   (PutEvents); the instances go ``reclaim_after`` seconds later. A drainer, if
   asked for, starts draining each node 0 to 2 s after the notice (seeded),
   racing spotguard as aws-node-termination-handler does.
3. The cycle waits until the doomed nodes are gone and the surges are over.
4. Return to spot: as many new spot nodes join as went; node-added is told
   (ApiServerSource add events) and pinged until the workloads stop moving.

:class:`~spotguard.ops.serving.Serving` measures what the users see throughout;
:func:`run` returns a :class:`Outcome` for :mod:`spotguard.ops.report`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import logging
import math
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotguard_sim import billing, costs, nodepools, readiness, scheduler, testing
from spotguard_sim import errors as sim_errors
from spotguard_sim import scenario as scenario_mod
from spotguard_sim import settings as settings_mod

from spotguard.logs import JsonFormatter, UserError
from spotguard.ops import aws, functions, money, serving, steady
from spotguard.ops import objects as objects_mod
from spotguard.policy import config as config_mod
from spotguard.policy import floors, moves, quantities, surgecopy, surges
from spotguard.policy.moves import MOVE
from spotguard.policy.views import NodeView
from spotguard.policy.workloads import SURGE, Kind, Workload

Obj = dict[str, Any]
INFRA_KINDS = {"Node", "Namespace", "NodePool", "EC2NodeClass"}
DRAINER_MAX_DELAY = 2.0  # simulated seconds after the notice
RECONCILE_SECONDS = 15.0  # the spot-interruption scheduled reconcile (simulated seconds)
# node-added passes this often while moves are in flight (its follow: spotguard.nodeadded.service,
# DEFAULT_FOLLOW_EVERY), otherwise at its schedule (functions.SCHEDULE_SECONDS); simulated seconds
FOLLOW_SECONDS = 10.0
# Pods a real second the simulated cluster creates, places through the webhook and starts
# while keeping the control plane's pace, beside the functions, on the 2-core build machine:
# half the 25 a second it placed large.yaml's pods at. ``pace="auto"`` slows the phases
# that ask more of it (the control plane's replacements after the notice, the moves back
# to spot) so that the simulated cluster is never slower, so never harsher, than a real one.
FAITHFUL_PODS_PER_SECOND = 12.0
# kube-scheduler binds a pod that fits within about a second at thousands of nodes (its
# scalability tests' pod startup SLO is 5 s at the 99th percentile, scheduling included):
# a simulated scheduler slower than this left pods waiting that a real one would have placed.
SCHEDULER_SECONDS = 5.0
PACES = ("auto", "fixed")


@dataclass
class Options:
    objects: list[Obj]
    interrupt: str | int | Sequence[str] = "all-spot"  # "all-spot", a count, or node names
    time_scale: float = 20.0
    pod_startup: float = 30.0
    reclaim_after: float = 120.0
    drainer: bool = False
    seed: int = 0
    return_to_spot: bool = True
    spot_price: float = 0.1  # of on-demand
    settle_seconds: float = 300.0  # simulated seconds after the reclaim to wait for the surges to end
    pace: str = "auto"  # "auto": slower than time_scale where the machine would lag (notice_scale); "fixed"
    scenario: str = ""  # where the objects came from (the report's title)
    keep_logs: Path | None = None  # a folder to keep the functions' logs in (default: none kept)
    # node-added's on-demand headroom (spotguard.policy.headroom: off, largest-node, all-spot): kept
    # from the placement on, so the notice finds it in place and its cost is in the steady bill
    headroom: str = "off"
    # the earliest signal: an EC2 rebalance recommendation for the doomed nodes this many simulated
    # seconds before their interruption warning (0: none), handled per ``rebalance_action``
    # (spotguard.policy.config.RebalanceAction: ignore, taint, surge)
    rebalance_lead: float = 0.0
    rebalance_action: str = "taint"


@dataclass
class Phase:
    """What the live view shows."""

    name: str = "starting"
    t: float = 0.0  # simulated seconds since the notice
    spot_nodes: int = 0
    surges: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Replacements:
    """Could any control plane have replaced the doomed Deployment pods in time?

    ``needed``: serving Deployment pods on the doomed nodes at the notice. A
    real kube-controller-manager's ReplicaSet controller creates pods through
    its own client, rate limited to ``qps`` a second (``--kube-api-qps``, burst
    ``burst``), so at most ``possible`` can be created early enough to be Ready
    (``pod_startup``) before the reclaim, however fast everything else is.
    ``created``: workload pods the simulated cluster created from the notice to
    the reclaim; ``expected``: what a real one would have created by then, at its QPS
    from the first of them (spotguard's surges take seconds to be written).
    """

    needed: int
    possible: int | None  # None: no client limit
    created: int
    expected: int
    qps: float
    burst: int
    room: int | None = None  # replacements the on-demand nodes that stay had room for at the notice


@dataclass
class Outcome:
    workloads: dict[str, Workload]
    floors: dict[str, int]
    doomed: list[str]
    drainer_delays: dict[str, float]
    before: dict[str, serving.Counts]
    rejoin: dict[str, serving.Counts]
    after: dict[str, serving.Counts]
    duration: float  # simulated seconds from the notice to the end
    series: list[tuple[float, str, int, int]]
    t0: float
    settled: bool
    returned: str  # "done", "timed out", or why it was skipped
    notes: list[str]
    options: Options
    replacements: Replacements | None = None
    time_scales: dict[str, float] = field(default_factory=dict)  # per phase: placing, notice, return
    scheduler_lag: dict[str, float] = field(default_factory=dict)  # pods bound since the notice, p99 and max waits
    spot_returned: float | None = None  # simulated seconds from the notice to new spot nodes joining
    money: dict[str, Any] = field(default_factory=dict)  # the instances' cost (spotguard.ops.money)
    at_risk: dict[str, int] = field(default_factory=dict)  # serving pods on the doomed nodes at the notice
    spot_launched: int = 0  # spot instances that ran before the notice (a scenario's or launched)
    steady: dict[str, Any] | None = None  # the wait for a provisioned cluster to settle (spotguard.ops.steady)
    steady_after: dict[str, Any] | None = None  # the same wait after the return to spot (the bill runs through it)
    billed: float = 0.0  # simulated seconds the money is over: from the first signal (a rebalance recommendation's
    # lead before the notice, when given) to the end


View = Callable[[Phase, serving.Serving, dict[str, Workload], dict[str, int]], None]


def split(objects: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """(nodes and namespaces, the rest the simulated cluster serves); pods are made by its controllers."""
    usable, _ = objects_mod.loadable(objects)
    infra = [o for o in usable if o.get("kind") in INFRA_KINDS]
    apps = [o for o in usable if o.get("kind") not in INFRA_KINDS]
    return infra, apps


def settings_of(objects: list[Obj]) -> settings_mod.Settings:
    """The scenario's control-plane settings (``kind: Settings``), upstream's defaults without one."""
    found, _ = settings_mod.split(objects)
    return found


def measured_cluster(infra: list[Obj], objects: list[Obj], **kw: Any) -> Any:
    """The simulated cluster of a measured run (the demo, simulate, replay, the benchmarks): the
    scenario's settings, and a deleted pod keeping its room for its grace period (or the
    scenario's ``kubelet.terminationSeconds``), not the test harness's 1 s cap."""
    settings = settings_of(objects)
    return testing.running_cluster(infra, settings=settings,
                                   termination_seconds=settings.kubelet.termination_seconds, **kw)


def check(options: Options) -> None:
    """Plain-sentence errors for what would fail later."""
    if options.time_scale <= 0:
        raise UserError("--time-scale must be a positive number of simulated seconds per real second")
    if options.pod_startup < 0:
        raise UserError("the pod startup time must not be negative")
    if options.reclaim_after <= 0:
        raise UserError("the time from notice to reclaim must be positive")
    if options.pace not in PACES:
        raise UserError(f"--pace {options.pace}: give auto or fixed")
    if not 0 <= options.rebalance_lead <= 3600:
        raise UserError(f"--rebalance-lead {options.rebalance_lead:g}: give 0 to 3600 seconds")
    if options.rebalance_action not in {a.value for a in config_mod.RebalanceAction}:
        raise UserError(f"--rebalance-action {options.rebalance_action}: give ignore, taint or surge")
    settings_of(options.objects)  # a bad Settings document: a plain error now
    infra, apps = split(options.objects)
    if not any(o.get("kind") in ("Deployment", "StatefulSet") for o in apps):
        raise UserError("the scenario has no Deployment or StatefulSet: there is nothing to protect")
    nodes = [o for o in infra if o.get("kind") == "Node"]
    cfg = config_mod.Config()
    spot = [n for n in nodes if cfg.node_capacity(_labels(n)).value == serving.SPOT]
    if provisioned(options.objects):
        return  # the spot nodes are launched for the pods: the doomed ones are known at the notice
    if not spot:
        raise UserError(
            "the scenario has no spot node: label some nodes node.kubernetes.io/capacity: spot, "
            "or give a Karpenter NodePool or Cluster Autoscaler node group that launches spot"
        )
    doomed(options, spot)


def provisioned(objects: list[Obj]) -> bool:
    """Spot capacity is launched (a NodePool or a node group allowing spot), not fixed in the scenario."""
    if any(g.capacity_type == "spot" for g in settings_of(objects).capacity.cluster_autoscaler.node_groups):
        return True
    for o in objects:
        if o.get("kind") != "NodePool":
            continue
        reqs = nodepools.requirements(o)
        if all(
            scheduler.match_requirement(r, {nodepools.CAPACITY_TYPE: "spot"})
            for r in reqs
            if r.get("key") == nodepools.CAPACITY_TYPE
        ):
            return True
    return False


def fastest_replacement(options: Options) -> tuple[float, str]:
    """The least time after the notice in which any cluster of this scenario could have a
    replacement pod Ready, and what it is made of, in words.

    With an on-demand node in the scenario, a pod start (assuming the node has room: the
    best case). With on-demand capacity only launched (a NodePool or a Cluster Autoscaler
    node group), the launch too: Karpenter's batch idle window (the autoscaler may scan at
    once), then the shortest launch to a Ready node the scenario allows, then the start.
    """
    objects = options.objects
    start = options.pod_startup
    cfg = config_mod.Config()
    nodes = [o for o in split(objects)[0] if o.get("kind") == "Node"]
    if any(cfg.node_capacity(_labels(n)).value == serving.ON_DEMAND for n in nodes):
        return start, f"a pod start of {start:g}s"
    capacity = settings_of(objects).capacity
    karpenter = any(o.get("kind") == "NodePool" for o in objects)
    if not karpenter and not capacity.cluster_autoscaler.node_groups:
        return start, f"a pod start of {start:g}s"
    wait = capacity.batch_idle if karpenter else 0.0
    launch = capacity.launch_to_ready[0]
    total = wait + launch + start
    batch = f"a {wait:g}s batch window, " if wait else ""
    return total, f"{batch}a launch of at least {launch:g}s to a Ready node and a pod start of {start:g}s"


def notice_scale(options: Options, pods: int, share: float = 1.0) -> float:
    """The time scale from the notice to the end of the surges: ``time_scale``, or slower
    where a real control plane replacing ``pods`` lost pods would create more pods a
    simulated second (at most its ``--kube-api-qps``) than this machine simulates
    faithfully at that speed (``share``: the part of the machine this run has, see
    :func:`machine_share`)."""
    rate = pods / max(1.0, options.reclaim_after - options.pod_startup)
    qps = settings_of(options.objects).controller_manager.kube_api_qps
    return _paced(options, min(rate, qps) if qps > 0 else rate, share)


def placing_scale(options: Options, pods: int, launch: float, share: float = 1.0) -> float:
    """The time scale of the placement on a provisioned cluster: ``time_scale``, or slower where
    a real control plane, placing ``pods`` as fast as its node autoscaler launches nodes for
    them (``launch``: a launch to a Ready node; then a pod start), would place more pods a
    simulated second than this machine simulates faithfully at that speed. Slower than a real
    one, the placement leaves pods pending batch after batch: the autoscaler launches node
    after node for a few pods each and consolidates them while the rest still wait (on
    ``medium-karpenter.yaml`` at x20, 2,000 replicas placed over 2,200 simulated seconds and
    14-34 node changes before the cluster settled, 2026-11-28)."""
    return _paced(options, pods / max(1.0, launch + options.pod_startup), share)


def return_scale(options: Options, moving: int, settle: float, share: float = 1.0) -> float:
    """The time scale of the return to spot: node-added moves one replica of each of
    ``moving`` workloads at a time, each a pod start and ``settle`` seconds."""
    return _paced(options, moving / (options.pod_startup + settle + FOLLOW_SECONDS), share)


def machine_share(load: float | None = None, cores: int | None = None) -> float:
    """The part of the machine a run has now: 1 while the 1-minute load average is within
    the cores, else cores / load (three runs side by side on 2 cores: about a third).
    :data:`FAITHFUL_PODS_PER_SECOND` was measured on a machine running one run; on a
    busier one the same simulated speed would leave the simulated control plane behind a
    real one (harsher than a real cluster, and a verdict that depends on the load)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # not on this platform
            return 1.0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1.0 if load <= cores else cores / load


def _paced(options: Options, pods_per_second: float, share: float = 1.0) -> float:
    """``time_scale``, or slower where ``pods_per_second`` simulated would outrun the machine
    (its faithful rate times ``share``)."""
    scale = options.time_scale
    if options.pace == "fixed" or pods_per_second <= 0:
        return scale
    faithful = FAITHFUL_PODS_PER_SECOND * max(0.05, min(1.0, share))
    return min(scale, math.floor(100 * faithful / pods_per_second) / 100 or 0.01)


def no_spot_note(launched: int) -> str:
    """Why a cycle's notice reclaims nothing: no spot node ran at the notice."""
    if not launched:
        return "no spot node ran at the notice: nothing was reclaimed (no pod was placed on spot capacity)"
    return (
        f"no spot node ran at the notice: the {launched} spot instance(s) that ran before it were gone by then "
        "(a provisioner removes a spot node left empty: the scheduler may bind the pods that prefer spot to room "
        "on the on-demand nodes the floors pay for, when those are Ready first), so nothing was reclaimed"
    )


def doomed(options: Options, spot_nodes: list[Obj]) -> list[str]:
    names = sorted(str(n["metadata"]["name"]) for n in spot_nodes)
    what = options.interrupt
    if what == "all-spot":
        return names
    if isinstance(what, int):
        if not 1 <= what <= len(names):
            raise UserError(f"--interrupt {what}: the scenario has {len(names)} spot nodes; give 1 to {len(names)}")
        return sorted(random.Random(options.seed).sample(names, what))
    wanted = list(what) if not isinstance(what, str) else [what]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise UserError(
            f"--interrupt: {', '.join(unknown)} {'is not a spot node' if len(unknown) == 1 else 'are not spot nodes'}"
            f" of the scenario (spot nodes: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''})"
        )
    return sorted(set(wanted))


@dataclass
class Watch:
    """What the waits show and measure: the live view, the phase, the serving tracker."""

    view: View | None
    phase: Phase
    tracker: serving.Serving
    wls: dict[str, Workload] = field(default_factory=dict)
    floor: dict[str, int] = field(default_factory=dict)
    t0: float | None = None
    sim: Any = None
    spot_returned: float | None = None  # simulated time new spot nodes joined
    deliveries: functions.Deliveries | None = None  # node-added's schedule and node events

    def show(self) -> None:
        if self.deliveries is not None:
            self.deliveries.tick()
        if self.view is None:
            return
        if self.t0 is not None and self.sim is not None:
            self.phase.t = self.sim.clock.now() - self.t0
        self.phase.spot_nodes = len(self.tracker.live_nodes(serving.SPOT))
        self.view(self.phase, self.tracker, self.wls, self.floor)

    def wait(self, what: Callable[[], bool], timeout: float, message: str, *, strict: bool = False) -> bool:
        """Poll ``what`` until true (True) or ``timeout`` real seconds (False, or a UserError if strict)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.show()
            if what():
                return True
            time.sleep(0.1)
        if strict:
            raise UserError(f"timed out after {timeout:.0f}s waiting for {message}")
        return False


def _workdir(stack: contextlib.ExitStack, keep: Path | None) -> Path:
    """Where the functions write their files: ``keep`` (kept) or a temporary folder (removed)."""
    if keep is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spotguard-")))
    keep.mkdir(parents=True, exist_ok=True)
    return keep


@contextlib.contextmanager
def _logging_to(path: Path, now: Callable[[], float]) -> Iterator[None]:
    """Every in-process log line (the interruption handler, node-added, the simulated cluster's
    controllers; the simulated scheduler's binds and failed attempts at DEBUG) at INFO into
    ``path`` as JSON, each with ``sim_time``: the simulated clock's
    reading, to line events up with the report. The console keeps its own level."""

    class SimTime(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            record.sim_time = round(now(), 3)
            return True

    root = logging.getLogger()
    before = root.level
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(JsonFormatter())
    handler.addFilter(SimTime())
    quiet = [(h, h.level) for h in root.handlers]
    for h, level in quiet:
        h.setLevel(max(level, before))
    root.addHandler(handler)
    root.setLevel(min(before, logging.INFO))
    # the simulated scheduler's binds and failed attempts too (DEBUG): where each pod went, when
    scheduler_log = logging.getLogger("spotguard.sim.scheduler")
    scheduler_level = scheduler_log.level
    scheduler_log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        scheduler_log.setLevel(scheduler_level)
        root.removeHandler(handler)
        handler.close()
        root.setLevel(before)
        for h, level in quiet:
            h.setLevel(level)


def run(options: Options, view: View | None = None) -> Outcome:
    check(options)
    infra, apps = split(options.objects)
    cfg = config_mod.Config()
    scale = options.time_scale
    with contextlib.ExitStack() as stack:
        workdir = _workdir(stack, options.keep_logs)
        # moto takes seconds to start: beside the cluster and the webhook, not before them.
        bus_cm = aws.running_bus()
        starting = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="moto-start")
        bus_future = starting.submit(bus_cm.__enter__)
        stack.push(lambda *exc: _close(bus_cm, bus_future, starting, exc))
        with loading():
            sim = stack.enter_context(
                measured_cluster(
                    infra, options.objects, time_scale=scale, ready_delay_seconds=options.pod_startup,
                    drainer=options.drainer,
                )
            )
        if options.keep_logs is not None:
            stack.enter_context(_logging_to(workdir / "spotguard.log", sim.clock.now))
        sim.store.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}}])
        tracker = serving.Serving(sim.clock.now, lambda labels: cfg.node_capacity(labels).value)
        tracker.start(sim.store)
        stack.callback(tracker.stop, sim.store)
        stack.enter_context(_ticking(tracker))
        watch = Watch(view, Phase("starting the functions"), tracker, sim=sim)
        _, skipped = objects_mod.loadable(options.objects)
        if skipped:
            watch.phase.notes.append(f"left out kinds the simulated cluster does not serve: {', '.join(skipped)}")
        watch.show()
        # A big scenario sends its pods through the webhook by the thousand: a second worker.
        pods = sum(_replicas(o) for o in apps)
        workers = 2 if pods > 1000 else 1
        # The guard's grace runs on the webhook's own real clock: sized for the slowest the notice may run.
        admission = stack.enter_context(
            functions.admission_server(
                sim,
                workdir,
                workers,
                time_scale=notice_scale(options, pods),
                log_level="WARNING" if options.keep_logs is None else "INFO",
            )
        )
        bus = bus_future.result()
        cover = config_mod.HeadroomCover(options.headroom)
        # the functions' settings: what the options change, the defaults otherwise
        action = config_mod.RebalanceAction(options.rebalance_action)
        functions_cfg = config_mod.Config(headroom=cover, rebalance_action=action)
        stack.enter_context(
            functions.interruption_poller(
                sim, bus.client("sqs"), bus.queue_url, lambda: sim.clock.real(RECONCILE_SECONDS), functions_cfg
            )
        )
        if cover is not config_mod.HeadroomCover.OFF:
            from spotguard.nodeadded import headroom as headroom_keeper  # where node-added is carried

            sim.store.apply_objects([headroom_keeper.priority_class()])
        served_node_added = (
            stack.enter_context(
                functions.node_added(
                    sim,
                    workdir,
                    functions_cfg,
                    workload_cache_seconds=admission.workload_cache_seconds,
                )
            )
            if options.return_to_spot or cover is not config_mod.HeadroomCover.OFF
            else None
        )
        node_added = served_node_added if options.return_to_spot else None
        if served_node_added is not None and served_node_added.available:
            # from now on node-added gets what the shipped wiring sends it: the schedule's pings (the
            # first at once: with headroom, it is launched for with the placement) and the nodes
            # that join (the placement's launches, the surges', the return's)
            watch.deliveries = functions.Deliveries(sim, served_node_added)

        # 1. the workloads, placed by the webhook: on a provisioned cluster the Deployments' burst at
        # a real control plane's pace (a StatefulSet's pods come one at a time, each once the one
        # before is Ready: they ask little of the machine, and the asked scale goes on for them)
        placing = scale
        bursting = sum(_replicas(o) for o in apps if o.get("kind") == "Deployment")
        if provisioned(options.objects):
            share = machine_share()
            placing = placing_scale(options, bursting, max(sim.settings.capacity.launch_to_ready), share)
            if placing < scale:
                sim.clock.set_scale(placing)
                watch.phase.notes.append(_slowed_note("the Deployments' placement", placing, options, share))
        watch.phase.name = "placing the workloads"
        with loading():
            sim.store.apply_objects(apps)
        wls = _workloads(sim.store)
        watch.wls = wls
        watch.floor = floor = {k: min(w.replicas, floors.floor_for(w, cfg).on_demand) for k, w in wls.items()}
        desired = {k: w.replicas for k, w in wls.items()}

        def placed(kinds: tuple[Kind, ...]) -> bool:
            counts = tracker.snapshot()
            return all(counts.get(k, serving.Counts()).total >= n for k, n in desired.items() if wls[k].kind in kinds)

        if placing < scale:
            watch.wait(
                lambda: placed((Kind.DEPLOYMENT,)),
                (4 * options.pod_startup) / placing + 60 + bursting / 10,
                "every Deployment pod to be placed and Ready",
                strict=True,
            )
            sim.clock.set_scale(scale)
        watch.wait(
            lambda: placed((Kind.DEPLOYMENT, Kind.STATEFULSET)),
            # A safety net, not a target: 20,000 pods through the webhook on a busy laptop take minutes.
            (4 * options.pod_startup) / scale + 60 + sum(desired.values()) / 10,
            "every pod to be placed and Ready",
            strict=True,
        )

        # 1b. a provisioned cluster's autoscaler packs the placement burst's nodes first: the
        # notice comes at the steady cost, not in the burst's transient
        views = WorkloadViews(sim.store)
        settled_before = _settle(sim, watch, options, views)

        # 2. the notice
        spot = [n for n in sim.store.list("nodes")[0] if cfg.node_capacity(_labels(n)).value == serving.SPOT]
        names = doomed(options, spot)
        launched = sum(1 for s in billing.of(sim.store).spans() if s.capacity_type == "spot")
        if not names:
            watch.phase.notes.append(no_spot_note(launched))
        by_name = {n["metadata"]["name"]: n for n in spot}
        rng = random.Random(options.seed)
        delays = {n: round(rng.uniform(0.0, DRAINER_MAX_DELAY), 3) if options.drainer else 0.0 for n in names}
        losing = tracker.serving_on(names)
        room = on_demand_room(sim.store.list("nodes")[0], sim.store.list("pods")[0], names, cfg)
        needed = sum(n for k, n in losing.items() if k in wls and wls[k].kind is Kind.DEPLOYMENT)
        share = machine_share()
        scales = {"placing": placing, "notice": notice_scale(options, sum(losing.values()), share)}
        if scales["notice"] < scale:
            sim.clock.set_scale(scales["notice"])
            watch.phase.notes.append(_slowed_note("the notice and the surges", scales["notice"], options, share))
        if cover is not config_mod.HeadroomCover.OFF:
            watch.phase.notes.append(_headroom_note(sim.store, cover))
        tracker.arm(desired)
        before = tracker.snapshot()
        ids = [NodeView.from_json(by_name[n]).instance_id for n in names]
        # the bill runs from the first signal: a rebalance recommendation's surge costs from there
        signal = sim.clock.now()
        # known to die from the first signal (the margins count from there): at the warning's reclaim
        tracker.will_die(names, signal + options.rebalance_lead + options.reclaim_after)
        if options.rebalance_lead > 0 and ids:
            bus.recommend_rebalance(ids, signal)
            watch.phase.name = f"rebalance recommendation: the warning comes {options.rebalance_lead:g}s later"
            watch.wait(lambda: sim.clock.now() >= signal + options.rebalance_lead,
                       sim.clock.real(options.rebalance_lead) + 30, "the interruption warning")  # fmt: skip
        t0 = watch.t0 = signal + options.rebalance_lead if options.rebalance_lead > 0 and ids else signal
        bus.warn(ids, t0)
        stack.enter_context(_reclaiming(sim, names, delays, t0, options.reclaim_after))
        watch.phase.name = f"notice: the doomed nodes go at t={options.reclaim_after:g}s"

        # 3. the reclaim and the surges' end
        def over() -> bool:
            current = views()
            watch.phase.surges = sum(1 for w in current.values() if _surging(w))
            if sim.clock.now() < t0 + options.reclaim_after:
                return False
            watch.phase.name = "reclaimed: waiting for the surges to end"
            counts = tracker.snapshot()
            return not watch.phase.surges and all(
                k in current and current[k].replicas == n and counts.get(k, serving.Counts()).total >= n
                for k, n in desired.items()
            )

        settled = watch.wait(over, sim.clock.real(options.reclaim_after + options.settle_seconds) + 10, "the surges")
        if not settled:
            watch.phase.notes.append(
                f"the surges had not ended {options.settle_seconds:g}s after the reclaim; went on to the return to spot"
            )

        reclaim = t0 + options.reclaim_after
        created, first = tracker.creations(signal, reclaim)  # a rebalance surge's pods count too
        replacements = _replacements(options, needed, created, reclaim - first if first is not None else 0.0, room)
        watch.phase.notes.extend(_replacement_notes(options, replacements))
        watch.phase.notes.extend(_lag_notes("after the notice", tracker.bind_lag()))

        # 4. back to spot
        tracker.settle()
        rejoin = tracker.snapshot()
        settled_at = sim.clock.now()
        notice_bound = tracker.bind_lag()[0]
        returned = "not asked for"
        settled_after: steady.Settled | None = None
        if node_added is not None:
            gone = [by_name[n] for n in names]
            quiet = steady.quiet_seconds(options.objects, sim.settings)
            settling = steady.Settling(quiet, lambda: views.busy(tracker)) if quiet else None
            returned = _return_to_spot(
                sim, node_added, gone, options, watch, cfg=cfg, scales=scales, views=views, settling=settling
            )
            # and the autoscaler packs what the surges and the return launched: the cycle's bill
            # runs until the cluster is steady again, so the interruption's whole cost is in it
            if returned == "done":
                prices = sim.settings.capacity.prices
                steady_rate = costs.rate(billing.of(sim.store).spans(), prices.hourly, signal)

                def back() -> bool:  # the cluster costs its steady rate of before the notice again
                    now = sim.clock.now()
                    return costs.rate(billing.of(sim.store).running(), prices.hourly, now) <= steady_rate + 1e-9

                settled_after = _settle(sim, watch, options, views, after=True, settling=settling, back=back)
        tracker.settle()
        after = tracker.snapshot()
        if node_added is not None:
            watch.phase.notes.extend(_lag_notes("during the return to spot", tracker.bind_lag(start=notice_bound)))
        bound, p99, longest = tracker.bind_lag()
        lag = {"pods": bound, "p99_seconds": round(p99, 1), "max_seconds": round(longest, 1)}
        end = sim.clock.now()
        duration = end - t0
        cost = money.measure(
            billing.of(sim.store).spans(), sim.settings.capacity.prices, t0=signal, settled=settled_at, end=end
        )
        admission.stop_soon()  # gunicorn takes a second or two to stop: start now, beside the rest
        watch.phase.name = "done"
        watch.show()
        return Outcome(
            workloads=wls, floors=floor, doomed=names, drainer_delays=delays if options.drainer else {},
            before=before, rejoin=rejoin, after=after, duration=duration, series=list(tracker.series), t0=t0,
            billed=end - signal,
            settled=settled, returned=returned, notes=watch.phase.notes, options=options, replacements=replacements,
            time_scales=scales, scheduler_lag=lag, money=cost, at_risk=losing, spot_launched=launched,
            spot_returned=None if watch.spot_returned is None else watch.spot_returned - t0,
            steady=None if settled_before is None else settled_before.as_json(),
            steady_after=None if settled_after is None else settled_after.as_json(),
        )  # fmt: skip
    raise AssertionError("unreachable")  # pragma: no cover


def _headroom_note(store: Any, cover: config_mod.HeadroomCover) -> str:
    """What the on-demand headroom's placeholders held at the notice."""
    from spotguard.policy import headroom

    held = [
        p
        for p in store.list("pods", "spotguard")[0]
        if (p["metadata"].get("labels") or {}).get(headroom.LABEL) == "true" and readiness.is_ready(p)
    ]
    cpu = sum(quantities.pod_requests(p.get("spec") or {}).get("cpu", 0) for p in held) / 1000
    memory = sum(quantities.pod_requests(p.get("spec") or {}).get("memory", 0) for p in held) / 2**30
    return (
        f"on-demand headroom ({cover}): {len(held)} placeholder(s) held {cpu:g} CPU and {memory:.2f} GiB "
        "at the notice (docs/headroom.md)"
    )


def _replacements(
    options: Options, needed: int, created: int, creating: float, room: int | None = None
) -> Replacements:
    """``creating``: simulated seconds from the first workload pod created after the notice
    (once spotguard's surges were written) to the reclaim, in which a real controller-manager
    would have created pods at its QPS. ``room``: replacements the on-demand nodes that stay
    had room for at the notice (:func:`on_demand_room`; None: as many as needed).

    The pods are created one after another at the QPS: the first ``room`` of them can start
    where they are (a pod start), the rest only on a node launched for them (the batch
    window and the launch before the start, :func:`fastest_replacement`). So at most
    ``max(min(room, in time to start), in time to be launched for)`` are Ready by the reclaim."""
    limits = settings_of(options.objects).controller_manager
    qps, burst = limits.kube_api_qps, limits.kube_api_burst
    possible = None
    if qps > 0:
        started = int(qps * max(0.0, options.reclaim_after - options.pod_startup)) + burst
        fastest, _ = fastest_replacement(options)
        launched = int(qps * (options.reclaim_after - fastest)) + burst if fastest < options.reclaim_after else 0
        possible = min(needed, max(min(needed if room is None else room, started), launched))
    expected = needed if qps <= 0 else min(needed, int(qps * max(0.0, creating)) + burst)
    return Replacements(
        needed=needed, possible=possible, created=created, expected=expected, qps=qps, burst=burst, room=room
    )


def on_demand_room(nodes: Sequence[Obj], pods: Sequence[Obj], doomed: Sequence[str], cfg: Any) -> int:
    """How many of the doomed nodes' Deployment pods the schedulable, Ready on-demand nodes
    that stay have room for (CPU, memory, pod count), each as small as the smallest of them:
    the most replacements that could start without a node launched for them."""
    gone = set(doomed)
    used: dict[str, dict[str, int]] = {}
    smallest: dict[str, int] | None = None
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        requests = quantities.pod_requests(p.get("spec") or {})
        used[node] = quantities.add(quantities.add(used.get(node, {}), requests), {"pods": 1})
        owners = (p.get("metadata") or {}).get("ownerReferences") or []
        if node in gone and any(o.get("kind") == "ReplicaSet" for o in owners):
            smallest = requests if smallest is None else {
                k: min(smallest.get(k, 0), requests.get(k, 0)) for k in ("cpu", "memory")}  # fmt: skip
    if smallest is None:
        return 0
    room = 0
    for n in nodes:
        name = n["metadata"]["name"]
        if name in gone or not readiness.is_ready(n) or (n.get("spec") or {}).get("unschedulable"):
            continue
        if cfg.node_capacity(_labels(n)).value != serving.ON_DEMAND:
            continue
        free = quantities.parse_resources((n.get("status") or {}).get("allocatable"))
        taken = used.get(name, {})
        fits = [max(0, free.get("pods", 110) - taken.get("pods", 0))]
        for k in ("cpu", "memory"):
            if smallest.get(k, 0) > 0:
                fits.append(max(0, free.get(k, 0) - taken.get(k, 0)) // smallest[k])
        room += min(fits)
    return room


def _replacement_notes(options: Options, r: Replacements) -> list[str]:
    notes = []
    if r.possible is not None and r.possible < r.needed:
        notes.append(
            f"the interruption took {r.needed} serving Deployment pods; a kube-controller-manager at "
            f"--kube-api-qps {r.qps:g} (burst {r.burst}) creates at most {r.qps:g} pods a second, so at most "
            f"{r.possible} replacements can be Ready ({options.pod_startup:g}s to start{_launch_words(options, r)}) "
            f"before the reclaim at {options.reclaim_after:g}s: no cluster with these settings keeps the promise "
            "here, whatever spotguard does"
        )
    if r.expected and r.created < 0.8 * r.expected:
        notes.append(
            f"the simulated cluster created {r.created} pods before the reclaim where a real control plane would "
            f"create about {r.expected} from its first (this machine is too slow for the scenario at this speed): the "
            "result is harsher than a real cluster's; run it again with a lower --time-scale"
        )
    return notes


def _launch_words(options: Options, r: Replacements) -> str:
    fastest, how = fastest_replacement(options)
    if fastest <= options.pod_startup:
        return ""
    room = "" if r.room is None else f"; the on-demand nodes had room for {r.room} of them at the notice"
    return f"; the others on a node launched for them: {how}{room}"


def _lag_notes(when: str, lag: tuple[int, float, float]) -> list[str]:
    """A note where the simulated scheduler left pods waiting longer than a real one would."""
    _, p99, longest = lag
    if p99 <= SCHEDULER_SECONDS:
        return []
    return [
        f"{when} the simulated scheduler left pods waiting up to {longest:.0f}s (99th percentile {p99:.0f}s) "
        f"before binding them, where kube-scheduler binds within about {SCHEDULER_SECONDS:g}s: the result is "
        "harsher than a real cluster's (this machine is too slow for the scenario at this speed)"
    ]


def _slowed_note(what: str, scale: float, options: Options, share: float = 1.0) -> str:
    busy = f", {share:.0%} of it free now (load average)" if share < 1.0 else ""
    rate = FAITHFUL_PODS_PER_SECOND * max(0.05, min(1.0, share))
    return (
        f"{what} ran at x{scale:g}, not x{options.time_scale:g}: at full speed the simulated control plane would "
        f"fall behind a real one on this machine (about {rate:g} pods a real second{busy}), which "
        "would make the result harsher than a real cluster's (--pace fixed keeps one speed)"
    )


def _replicas(obj: Obj) -> int:
    if obj.get("kind") not in ("Deployment", "StatefulSet"):
        return 0
    value = (obj.get("spec") or {}).get("replicas", 1)
    return value if isinstance(value, int) else 1


def _close(cm: Any, future: concurrent.futures.Future[Any], pool: concurrent.futures.Executor, exc: Any) -> bool:
    """Exit a context entered in ``future`` (waiting for it to be entered first)."""
    try:
        future.result()
    except BaseException:
        return False  # it never started: nothing to stop
    finally:
        pool.shutdown(wait=True)
    return bool(cm.__exit__(*exc))


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """The scenario's objects go into the simulated cluster: one it refuses (an invalid
    object, as kube-apiserver would answer 422) is the user's to fix, a sentence."""
    from spotguard_sim import errors

    try:
        yield
    except errors.StatusError as exc:
        raise UserError(f"the scenario cannot be loaded: {exc.message}") from exc


@contextlib.contextmanager
def loaded_cluster(objs: list[Obj], *, time_scale: float = 20.0, pod_startup: float = 0.0) -> Iterator[Any]:
    """The simulated cluster with the scenario's workloads placed by the admission webhook and Ready.

    For replaying events against a scenario or snapshot: yields the running cluster.
    """
    infra, apps = split(objs)
    if not any(o.get("kind") == "Node" for o in infra):
        raise UserError("the scenario has no nodes: pods would never be placed")
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spotguard-")))
        with loading():
            sim = stack.enter_context(
                measured_cluster(infra, objs, time_scale=time_scale, ready_delay_seconds=pod_startup)
            )
        sim.store.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}}])
        stack.enter_context(functions.admission_server(sim, workdir))
        with loading():
            sim.store.apply_objects(apps)
        desired = sum(w.replicas for w in _workloads(sim.store).values())

        def ready() -> bool:
            return sum(1 for p in sim.store.list("pods")[0] if readiness.is_ready(p)) >= desired

        functions.wait_until(ready, 60 + desired / 50 + 4 * pod_startup / time_scale, "every pod to be Ready")
        yield sim


def _settle(
    sim: Any,
    watch: Watch,
    options: Options,
    views: WorkloadViews,
    *,
    after: bool = False,
    settling: steady.Settling | None = None,
    back: Callable[[], bool] | None = None,
) -> steady.Settled | None:
    """Wait until the node autoscaler has had nothing to change for as long as it takes to act:
    before the notice, or ``after`` the return to spot (``settling`` the return's own, which
    followed the nodes through it: one quiet period serves both; ``back``: the cluster costs its
    steady rate again, which ends the wait too). node-added gets its deliveries meanwhile
    (:attr:`Watch.deliveries`, ticked by :meth:`Watch.show`)."""
    watch.phase.name = (
        "back on spot: waiting for the node autoscaler to pack what the surges and the return launched"
        if after
        else "placed: waiting for the node autoscaler to settle"
    )
    settled = steady.settle(
        sim, options.objects, lambda: views.busy(watch.tracker), show=watch.show, settling=settling, back=back
    )
    if settled is not None:
        watch.phase.notes.append(settled.note(after=after))
    return settled


def _return_to_spot(
    sim: Any,
    node_added: functions.NodeAdded,
    gone: list[Obj],
    options: Options,
    watch: Watch,
    *,
    cfg: config_mod.Config,
    scales: dict[str, float],
    views: WorkloadViews,
    settling: steady.Settling | None = None,
) -> str:
    """node-added moves the workloads back (pinged as on its schedule) until each is at its
    optimum or nothing moved for a while; ``settling`` follows the nodes meanwhile (the
    steady wait after it goes on from there)."""
    if not node_added.available:
        watch.phase.notes.append(f"return to spot skipped: {node_added.why}")
        return f"skipped: {node_added.why}"
    moves = {k: w.replicas - watch.floor.get(k, w.replicas) for k, w in watch.wls.items()}
    one_move = options.pod_startup + cfg.rebalance_settle_seconds + functions.SCHEDULE_SECONDS
    share = machine_share()
    moving = sum(1 for n in moves.values() if n > 0)
    scales["return"] = return_scale(options, moving, cfg.rebalance_settle_seconds, share)
    sim.clock.set_scale(scales["return"])
    if scales["return"] < options.time_scale:
        watch.phase.notes.append(_slowed_note("the return to spot", scales["return"], options, share))
    watch.phase.name = "new spot nodes joined; node-added moves workloads back"
    # a provisioned cluster launches the spot nodes the moved pods ask for: none is added by hand
    fresh = [] if provisioned(options.objects) else [replacement(n) for n in gone]
    watch.spot_returned = sim.clock.now()
    sim.store.apply_objects(fresh)  # node-added hears of them as of every node that joins (Watch.show)
    last_change = [sim.clock.now(), _spot_serving(watch.tracker)]
    # How long nothing may change before the return counts as over: node-added leaves a workload
    # alone while its newest pod is younger than the settle time, passes come at the schedule,
    # and on a provisioned cluster a move's new pod waits for the spot node launched for it.
    launch = max(sim.settings.capacity.launch_to_ready) if provisioned(options.objects) else 0.0
    quiet = 2 * functions.SCHEDULE_SECONDS + options.pod_startup + cfg.rebalance_settle_seconds + launch

    def back() -> bool:
        now = sim.clock.now()
        spot_now = _spot_serving(watch.tracker)
        if spot_now != last_change[1] or _moving(views, watch.tracker):
            last_change[:] = [now, spot_now]
        if settling is not None:
            settling.steady(sim.store.list("nodes")[0], now)
        # Every workload at its desired count, and every replica above its floor on spot (the
        # optimum) or nothing moved for ``quiet``: done.
        counts = watch.tracker.snapshot()
        full = all(counts.get(k, serving.Counts()).total >= w.replicas for k, w in watch.wls.items())
        optimal = all(
            _back(counts.get(k, serving.Counts()), w, watch.floor.get(k, w.replicas)) for k, w in watch.wls.items()
        )
        return full and (optimal or now - last_change[0] >= quiet)

    # One replica of each workload at a time: the longest return is the workload with the most to move;
    # and the autoscaler packs the surges' nodes meanwhile: each node it drains is surged first, and
    # node-added leaves a surging workload alone (a move whose "+k" met such a surge ends "never
    # begun" and is planned again a pass later: seen in the demo's logs, 2026-11-28): two of its
    # quiet periods more.
    most = max(moves.values(), default=0)
    packing = 2 * steady.quiet_seconds(options.objects, sim.settings)
    bound = 600 + options.pod_startup * 4 + most * one_move + packing
    ok = watch.wait(back, sim.clock.real(bound) + 30, "the return to spot")
    if not ok:
        watch.phase.notes.append(
            "the workloads had not settled back on spot when the cycle gave up waiting: "
            + _not_back(watch.tracker.snapshot(), watch.wls, watch.floor, views())
        )
    return "done" if ok else "timed out"


def _back(c: serving.Counts, w: Workload, floor: int) -> bool:
    """At its optimum: every replica above its floor serving on spot, and no move half done (its
    extra replica still there)."""
    return c.serving[serving.SPOT] >= w.replicas - floor and c.total == w.replicas


def _not_back(
    counts: dict[str, serving.Counts], wls: dict[str, Workload], floor: dict[str, int], current: dict[str, Workload]
) -> str:
    """Which workloads were not back at their optimum, and what held each (its move record)."""
    out = []
    for key, w in sorted(wls.items()):
        c = counts.get(key, serving.Counts())
        if _back(c, w, floor.get(key, w.replicas)):
            continue
        want = w.replicas - floor.get(key, w.replicas)
        now = current.get(key)
        record = moves.MoveRecord.of(now) if now is not None and MOVE in now.annotations else None
        held = f"; {'held' if record.held else 'moving'}: {record.reason}" if record is not None else ""
        surging = "; a surge in progress" if now is not None and _surging(now) else ""
        out.append(
            f"{key} {c.serving[serving.SPOT]} of {want} on spot, {c.total} serving for {w.replicas}{held}{surging}"
        )
    return ", ".join(out) or "none (the last poll came too late)"


def replacement(node: Obj) -> Obj:
    """A new spot node like ``node`` (its instance type, zone and labels), with a new name and instance."""
    new = copy.deepcopy(node)
    old = str(new["metadata"]["name"])
    name = f"{old}-b"
    labels = dict(new["metadata"].get("labels") or {})
    if "kubernetes.io/hostname" in labels:
        labels["kubernetes.io/hostname"] = name
    zone = labels.get("topology.kubernetes.io/zone", "us-east-1a")
    new["metadata"] = {"name": name, "labels": labels}
    spec = new.setdefault("spec", {})
    spec.pop("unschedulable", None)
    spec["taints"] = [t for t in spec.get("taints") or [] if not str(t.get("key", "")).startswith("spotguard.io/")]
    if not spec["taints"]:
        spec.pop("taints")
    spec["providerID"] = f"aws:///{zone}/{scenario_mod.instance_id(name)}"
    status = new.get("status") or {}
    new["status"] = {k: v for k, v in status.items() if k in ("capacity", "allocatable", "nodeInfo")}
    return new


def _surging(w: Workload) -> bool:
    """A surge in progress (a record kept as done, while its nodes linger in the API, is over)."""
    if SURGE not in w.annotations:
        return False
    record = surges.SurgeRecord.of(w)
    return record is None or not record.done


def _moving(views: WorkloadViews, tracker: serving.Serving) -> bool:
    """A move under way: a workload carries node-added's move record, or one of its pods waits
    to be scheduled (the tracker follows them: no list of every pod)."""
    return tracker.unbound() > 0 or any(MOVE in w.annotations for w in views().values())


def _spot_serving(tracker: serving.Serving) -> int:
    return sum(c.serving[serving.SPOT] for c in tracker.snapshot().values())


def _labels(node: Obj) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _workloads(store: Any) -> dict[str, Workload]:
    """The Deployments and StatefulSets of ``store`` now (one read: :class:`WorkloadViews` for polls)."""
    return WorkloadViews(store)()


class WorkloadViews:
    """The Deployments and StatefulSets of ``store`` as :class:`Workload` views, for the cycle's
    polls (every 0.1 s): only the objects written since the last call are parsed again."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._seen: dict[tuple[str, str, str], tuple[int, Workload]] = {}

    def __call__(self) -> dict[str, Workload]:
        out: dict[str, Workload] = {}
        seen: dict[tuple[str, str, str], tuple[int, Workload]] = {}
        for res, kind in (("deployments", "Deployment"), ("statefulsets", "StatefulSet")):
            for entry in self.store.list_entries(res)[0]:
                meta = entry.obj.get("metadata") or {}
                key = (res, str(meta.get("namespace", "")), str(meta.get("name", "")))
                known = self._seen.get(key)
                if known is None or known[0] != entry.rv:
                    obj = entry.copy()
                    obj.setdefault("kind", kind)
                    known = (entry.rv, Workload.from_json(obj))
                seen[key] = known
                out[known[1].key] = known[1]
        self._seen = seen
        # A copy's surge keeps its record on the copy (surgecopy.RECORD), not on the Deployment.
        return surgecopy.views_with_records(out, (e.obj for e in self.store.list_entries("replicasets")[0]))

    def busy(self, tracker: serving.Serving) -> bool:
        """Pods waiting or not Ready, a surge or a move in progress: the cluster is not steady."""
        current = self()
        counts = tracker.snapshot()
        return (
            tracker.unbound() > 0
            or any(_surging(w) or MOVE in w.annotations for w in current.values())
            or any(counts.get(k, serving.Counts()).total < w.replicas for k, w in current.items())
        )


@contextlib.contextmanager
def _in_background(name: str, run: Callable[[threading.Event], None]) -> Iterator[None]:
    """``run(stop)`` in a daemon thread while the block runs; ``stop`` is set at its end."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _ticking(tracker: serving.Serving) -> contextlib.AbstractContextManager[None]:
    def tick(stop: threading.Event) -> None:
        while not stop.wait(0.02):
            tracker.tick()

    return _in_background("serving-ticker", tick)


def _reclaiming(
    sim: Any, names: list[str], delays: dict[str, float], t0: float, after: float
) -> contextlib.AbstractContextManager[None]:
    """Mark each node for reclaim at ``t0 + after``, ``delays[node]`` after the notice.

    The simulated drainer (when on) drains a node as soon as it is marked, so the
    delay is when the drainer acts; the reclaim time is the same for every node.
    """
    order = sorted(names, key=lambda n: delays[n])

    def mark(stop: threading.Event) -> None:
        for name in order:
            while not stop.is_set():
                wait = t0 + delays[name] - sim.clock.now()
                if wait <= 0:
                    break
                stop.wait(sim.clock.real(wait))
            if stop.is_set():
                return
            # A node already gone (a provisioner removed it since the notice was planned: its
            # consolidation or its own interruption handling) has nothing left to reclaim.
            with contextlib.suppress(sim_errors.NotFound):
                sim.reclaim([name], after_seconds=max(0.0, t0 + after - sim.clock.now()))

    return _in_background("reclaim", mark)
