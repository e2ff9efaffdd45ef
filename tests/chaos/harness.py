"""The chaos bed: the simulated cluster with every spotguard function wired as in production.

- the admission webhook served over HTTPS and registered with the shipped
  MutatingWebhookConfiguration (failurePolicy Ignore, 3 s timeout): it places
  every pod the simulated controllers create, and can be taken down;
- EC2 notices as EventBridge sends them to SQS (moto in server mode), read by
  the spot-interruption process's poller, with its reconcile every 15 s;
- the node-added reconcile every minute;
- a :class:`spotguard_sim.readiness.Tracker` that sees every change of the
  serving pods (Ready, not terminating, on a node whose instance runs).

:meth:`Chaos.settle` waits until everything is back (no surge, no move, no
budget, taint, raised autoscaler, ledger entry or stale reservation; every
workload at its owner's count and serving it; the queue empty), and
:meth:`Chaos.check_promise` asserts the promise on what the tracker saw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotguard import certs
from spotguard.admission import app as admission_app
from spotguard.admission import core, registration, reservations
from spotguard.gateway import kube
from spotguard.interruption import ledger
from spotguard.policy import config as config_mod
from spotguard.policy import evictions as guard_policy
from spotguard.policy import floors, moves
from spotguard.policy import headroom as headroom_policy
from spotguard.policy.interruption import Budget
from spotguard.policy.notices import NODE_NOTICE, NodeNotice, NoticeKind
from spotguard.policy.workloads import SURGE, SURGE_OF, Workload
from spotguard_sim import objects, readiness, testing
from spotguard_sim import settings as sim_settings

from tests.chaos import functions
from tests.records import with_copy_records

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]

TIME_SCALE = 20.0
READY_DELAY = 30.0  # simulated seconds a started pod takes to be Ready
RECLAIM_AFTER = 120.0  # the two-minute notice
# node-added's on-demand headroom (docs/headroom.md): its placeholders' Deployment, not a workload
# the promise is about (its pods are preempted by a surge by design)
HEADROOM_KEY = f"Deployment/spotguard/{headroom_policy.NAME}"
# SQS runs in real time. A failed notice comes back after RETRY_DELAY real seconds (20
# simulated: production's poller waits 5 s, so this is harsher) and a message whose
# consumer died after VISIBILITY real seconds (40 simulated: infra/aws sets 30 to 60 s).
VISIBILITY = 2
RETRY_DELAY = 1
MAX_RECEIVES = 20  # the dead-letter queue's redrive policy (infra/aws: 5 receives over minutes)
SETTLE_TIMEOUT = 150.0  # real seconds at TIME_SCALE (see Chaos.window)
# Runs whose API requests hang (timeouts) go at x4, not x20. A hung request costs real time (the
# client's timeout, the webhook's 3 s), and at x20 every real second is 20 of the cluster's: a pod
# created through a webhook whose read hangs waited 60 simulated seconds (3 in production), so a
# surge's slow-start batches (1, 2, 4) took three minutes and no surge was Ready at the reclaim,
# whatever spotguard did (10 of 12 scenarios broke so on 2026-11-26). At x4 the functions' client
# times out after 10 simulated seconds (production's), the webhook's 3 s costs 12 (4x
# production's), the guard's grace and error hold are production's, and every cluster timing is
# unchanged: still harsher than a real cluster, and no kinder.
DELAY_TIME_SCALE = 4.0
TAINT_KEY = "spotguard.io/interruption"
REGION = "us-east-1"
ACCOUNT = "123456789012"
DETAIL_TYPES = {
    NoticeKind.INTERRUPTION: "EC2 Spot Instance Interruption Warning",
    NoticeKind.REBALANCE: "EC2 Instance Rebalance Recommendation",
    NoticeKind.STATE_CHANGE: "EC2 Instance State-change Notification",
}
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def wait_until(what: Callable[[], bool], timeout: float, message: str | Callable[[], str], step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message() if callable(message) else message}")


# -- the cluster -------------------------------------------------------------------------------


def node(name: str, capacity: str, zone: str, *, cpu: str, pods: str = "110") -> Obj:
    provider = objects.provider_id(zone, objects.instance_id(name))
    return objects.node(name, capacity, zone=zone, cpu=cpu, pods=pods, provider=provider)


def nodes(*, on_demand: int = 3, spot: int = 6, on_demand_pods: str = "110") -> list[Obj]:
    out: list[Obj] = [objects.namespace("shop"), objects.namespace("spotguard")]
    out += [node(f"od-{i}", "on-demand", ZONES[i % 3], cpu="16", pods=on_demand_pods) for i in range(on_demand)]
    out += [node(f"spot-{i}", "spot", ZONES[i % 3], cpu="8") for i in range(spot)]
    return out


def workloads() -> list[Obj]:
    """Many replicas and one, a user budget, an autoscaler, a percentage floor, a single
    replica allowed on spot, two StatefulSets (33 pods)."""
    ns = "shop"
    return [
        objects.deployment("web", 6, namespace=ns),
        objects.pdb("web", "web", namespace=ns, max_unavailable=1),
        objects.deployment("api", 3, namespace=ns),
        objects.hpa("api", "api", 3, 8, namespace=ns, cpu_utilization=80),
        objects.deployment("cart", 4, namespace=ns, annotations={"spotguard.io/min-on-demand": "50%"}),
        objects.deployment("single", 1, namespace=ns),
        objects.deployment("solo", 1, namespace=ns, annotations={"spotguard.io/min-on-demand": "0"}),
        objects.deployment("worker", 8, namespace=ns),
        objects.statefulset("db", 3, namespace=ns, policy="Parallel"),
        objects.statefulset("queue", 5, namespace=ns, policy="Parallel"),
    ]


def eventbridge(kind: NoticeKind, instance_id: str, event_id: str, when: float, state: str = "") -> str:
    """An EC2 event as EventBridge puts it on the queue (the message body)."""
    detail: Obj = {"instance-id": instance_id}
    if kind is NoticeKind.INTERRUPTION:
        detail["instance-action"] = "terminate"
    if kind is NoticeKind.STATE_CHANGE:
        detail["state"] = state
    return json.dumps(
        {
            "version": "0",
            "id": event_id,
            "detail-type": DETAIL_TYPES[kind],
            "source": "aws.ec2",
            "account": ACCOUNT,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance_id}"],
            "detail": detail,
        }
    )


# -- the admission webhook ---------------------------------------------------------------------


# The eviction guard's grace and error hold bound spotguard's own latency (a notice's way
# through SQS, the poller and the API; an API server's recovery), which runs in real time here
# while the guard's clock is the cluster's: at x20 production's 8 s grace is 0.4 real seconds,
# less than one plan under load with 20 % 500s takes. As the clients' timeouts (at least one
# real second), they get a floor in real time: at least 2 real seconds (40 simulated at x20).
# Every cluster timing (the notice window, the drainer, pod start) stays simulated.
GUARD_REAL_FLOOR_SECONDS = 2.0


def guard_timing(time_scale: float) -> guard_policy.Timing:
    default = guard_policy.Timing()
    floor = GUARD_REAL_FLOOR_SECONDS * time_scale
    return dataclasses.replace(default, grace=max(default.grace, floor), error_hold=max(default.error_hold, floor))


class Webhook:
    """``spotguard serve admission`` over HTTPS on loopback, registered with the shipped configuration."""

    def __init__(self, sim: Any, workdir: Path, k: kube.Kube) -> None:
        self.sim = sim
        self.paths = certs.make(workdir / "webhook-certs", ["localhost"], ["127.0.0.1"])
        self.k = k
        self.server: Any = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # As `spotguard serve admission` builds it: its client under the admission's retry
        # policy (two tries within 1.5 s), the server's Retry-After in simulated seconds.
        scale = max(1.0, float(self.sim.clock.time_scale))
        ctx = core.Context(config_mod.Config(), self.k.with_policy(functions.in_simulated_time(core.API_POLICY, scale)))
        # The webhook caches the workload for 2 s of real time: scale it with the cluster's time.
        ctx.resolver.workload_ttl /= scale
        ctx.resolver.node_ttl /= scale
        self.server = make_server(
            "127.0.0.1",
            0,
            admission_app.create_app(ctx),
            threaded=True,
            ssl_context=(str(self.paths.cert), str(self.paths.key)),
        )
        self.thread = threading.Thread(target=self.server.serve_forever, name="admission", daemon=True)
        self.thread.start()
        # The eviction guard measures on the cluster's clock (the notices' reclaim times are in it).
        from spotguard.admission import evictions, sightings

        refresh = sightings.REFRESH_SECONDS / scale  # its reads of sighted nodes, in simulated time
        evictions.configure(ctx, evictions.Guard(clock=self.sim.clock.now, timing=guard_timing(scale), refresh=refresh))
        registration.register(self.sim.store, f"https://127.0.0.1:{self.server.server_port}", self.paths.ca_bundle)

    def stop(self) -> None:
        """Down: the API server's calls fail to connect (the configuration stays registered)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(10)


# -- the queue ---------------------------------------------------------------------------------


class Queue:
    """The spot-interruption queue and its dead-letter queue on moto (server mode)."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        name = f"chaos-{uuid.uuid4().hex[:10]}"
        self.dlq_url = sqs.create_queue(QueueName=name + "-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=self.dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVES)})
        self.url = sqs.create_queue(
            QueueName=name,
            Attributes={"VisibilityTimeout": str(VISIBILITY), "RedrivePolicy": redrive},
        )["QueueUrl"]

    def send(self, bodies: Sequence[str]) -> None:
        for i in range(0, len(bodies), 10):
            entries = [{"Id": str(j), "MessageBody": b} for j, b in enumerate(bodies[i : i + 10])]
            answer = self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
            assert not answer.get("Failed"), answer

    def depth(self, url: str | None = None) -> int:
        """Messages on the queue, visible or in flight."""
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


# -- the bed -----------------------------------------------------------------------------------


@dataclass
class Sent:
    event_id: str
    node: str
    kind: NoticeKind


@dataclass
class Chaos:
    sim: Any
    k: kube.Kube
    queue: Queue
    webhook: Webhook
    cfg: config_mod.Config
    workdir: Path
    tracker: readiness.Tracker = field(default_factory=readiness.Tracker)
    reclaims: list[float] = field(default_factory=list)  # simulated times of the reclaims asked for
    owner: dict[str, int] = field(default_factory=dict)  # key -> the count its owner wants
    floor: dict[str, int] = field(default_factory=dict)
    autoscalers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min, max)
    before: dict[str, int] = field(default_factory=dict)  # serving just before the first notice
    sent: list[Sent] = field(default_factory=list)
    taints_seen: dict[str, set[str]] = field(default_factory=dict)  # node -> event ids of its taints/notices
    dips: list[tuple[float, str, int]] = field(default_factory=list)  # (seconds after t0, key, serving) below before
    # Event name -> simulated time it was written: the Events carry the writer's wall-clock
    # time, and the simulated clock runs time_scale times faster (they cannot be set side by side).
    events_at: dict[str, float] = field(default_factory=dict)
    doomed: set[str] = field(default_factory=set)
    t0: float | None = None  # simulated time of the first notice
    recovered_at: float | None = None
    interruption: functions.InterruptionProcess | None = None
    node_added: functions.Schedule | None = None
    child: subprocess.Popen[bytes] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- setup

    def spot(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.sim.store.list("nodes")[0] if _capacity(n) == "spot")

    def workload_views(self) -> dict[str, Workload]:
        out = {}
        for res, kind in (("deployments", "Deployment"), ("statefulsets", "StatefulSet")):
            for obj in self.sim.store.list(res)[0]:
                obj.setdefault("kind", kind)
                w = Workload.from_json(obj)
                out[w.key] = w
        return with_copy_records(self.sim.store, out)

    def serving(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.sim.store.list("pods")[0]:
            key = readiness.workload_key(p)
            if key and self.sim.serving(p):
                counts[key] = counts.get(key, 0) + 1
        return counts

    def all_serving(self) -> bool:
        now = self.serving()
        return all(now.get(k, 0) == n for k, n in self.owner.items())

    def everything_serving(self) -> bool:
        """Every live pod of every workload scheduled and serving (surge pods included)."""
        for p in self.sim.store.list("pods")[0]:
            live = readiness.workload_key(p) and not p["metadata"].get("deletionTimestamp")
            if live and not self.sim.serving(p):
                return False
        return True

    def below_floor(self) -> dict[str, tuple[int, int]]:
        """Workloads with fewer serving pods on on-demand nodes than their floor now: key -> (have, floor)."""
        caps = {n["metadata"]["name"]: _capacity(n) for n in self.sim.store.list("nodes")[0]}
        have: dict[str, int] = {}
        for p in self.sim.store.list("pods")[0]:
            key = readiness.workload_key(p)
            if key and self.sim.serving(p) and caps.get(p["spec"].get("nodeName", "")) == "on-demand":
                have[key] = have.get(key, 0) + 1
        out = {}
        for key, w in self.workload_views().items():
            want = floors.floor_for(w, self.cfg).on_demand
            if have.get(key, 0) < want:
                out[key] = (have.get(key, 0), want)
        return out

    def window(self, seconds: float) -> float:
        """Real seconds to wait for what takes ``seconds`` at the default TIME_SCALE: the same
        simulated length at any scale. A wait for the cluster or the functions (pods starting,
        node-added's moves, a surge's end) is one in simulated time; at x4 (the latency
        columns) a real-second window tuned at x20 gave them a fifth of it, and a loaded
        machine turned slow convergence red (half and webhook-down under timeouts: "a
        node-added move in progress" at the end of the window, on the code before and after
        2026-11-26's fixes alike)."""
        return seconds * max(1.0, TIME_SCALE / float(self.sim.clock.time_scale))

    def load(self, objs: list[Obj]) -> None:
        self.sim.store.apply_objects(objs)
        count = sum(1 for o in objs if o["kind"] in ("Deployment", "StatefulSet"))
        wait_until(lambda: len(self.workload_views()) >= count, self.window(10), "the workloads")
        self.record_owner()
        wait_until(
            self.all_serving, self.window(60), lambda: f"every pod serving: {self.serving()} of {self.owner}"
        )

    def record_owner(self) -> None:
        for key, w in self.workload_views().items():
            self.owner[key] = w.replicas
            self.floor[key] = floors.floor_for(w, self.cfg).on_demand
        for h in self.sim.store.list("horizontalpodautoscalers")[0]:
            self.autoscalers[h["metadata"]["name"]] = (h["spec"].get("minReplicas", 1), h["spec"]["maxReplicas"])

    def start_functions(self, *, interruption_in_process: bool = True) -> None:
        policy = functions.scaled_policy(self.sim.clock.time_scale)
        clock = self.sim.clock.now
        if interruption_in_process:
            self.interruption = functions.InterruptionProcess(
                kube.Kube(self.sim.api_client(), policy=policy),
                self.cfg,
                clock,
                self.queue.sqs,
                self.queue.url,
                time_scale=self.sim.clock.time_scale,
                visibility=VISIBILITY,
                retry_delay=RETRY_DELAY,
            ).start()
        else:
            self.start_child()
        self.node_added = functions.node_added(
            kube.Kube(self.sim.api_client(), policy=policy), self.cfg, clock, self.sim.clock.time_scale
        ).start()

    def start_child(self) -> None:
        """The spot-interruption process as a separate OS process (it can be killed)."""
        spec = self.sim.clock.spec()
        log = (self.workdir / f"interruption-{time.monotonic_ns()}.log").open("wb")
        cmd = [
            sys.executable, "-m", "tests.chaos.functions", "--kubeconfig", str(self.sim.kubeconfig),
            "--queue-url", self.queue.url, "--clock", spec, "--visibility", str(VISIBILITY),
            "--retry-delay", str(RETRY_DELAY),
        ]  # fmt: skip
        env = {**os.environ, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}
        self.child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, env=env)
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        assert line.strip() == b"ready", f"the interruption process did not start: {line!r}"

    def kill_child(self) -> None:
        assert self.child is not None
        self.child.kill()
        self.child.wait(10)
        self.child = None

    def stop_functions(self) -> None:
        if self.interruption is not None:
            self.interruption.stop()
        if self.node_added is not None:
            self.node_added.stop()
        if self.child is not None:
            self.child.terminate()
            try:
                self.child.wait(20)
            except subprocess.TimeoutExpired:
                self.child.kill()
            self.child = None

    def arm(self) -> None:
        """The moment just before the first notice: the serving counts to keep from now on."""
        if self.t0 is not None:
            return
        self.tracker.start(self.sim.store)
        self.tracker.clock = self.sim.clock.now
        self.tracker.arm(self.spot())
        self.before = self.tracker.counts()
        self.t0 = self.sim.clock.now()
        self.sim.store.subscribe(self._on_change)
        self.sim.cloud.subscribe(lambda *_: self._dip())

    def _on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        if resource == "pods":
            self._dip()
        if TRACE and resource in ("pods", "replicasets"):
            with contextlib.suppress(Exception):  # a trace never stops the tracking above
                _trace(event_type, resource, obj)
        if resource == "events" and event_type == "ADDED":
            with self.lock:
                self.events_at.setdefault(obj["metadata"]["name"], self.sim.clock.now())
        if resource != "nodes" or event_type == "DELETED":
            return
        name = obj["metadata"]["name"]
        mark = NodeNotice.parse((obj["metadata"].get("annotations") or {}).get(NODE_NOTICE))
        for t in (obj.get("spec") or {}).get("taints") or []:
            if t.get("key") == TAINT_KEY:
                with self.lock:
                    seen = self.taints_seen.setdefault(name, set())
                    seen.add(str(t.get("value", "")))
                    if mark is not None:
                        seen.add(mark.event_id)

    def _dip(self) -> None:
        """Record when a workload serves fewer than before (for the failure message)."""
        if self.t0 is None:
            return
        now = self.tracker.counts()
        with self.lock:
            for key, had in self.before.items():
                if key == HEADROOM_KEY:
                    continue
                if now.get(key, 0) < had and not any(d[1] == key and d[2] <= now.get(key, 0) for d in self.dips):
                    self.dips.append((round(self.sim.clock.now() - self.t0, 1), key, now.get(key, 0)))
                    if TRACE:
                        _trace_log.warning("dip", extra={"workload": key, "serving": now.get(key, 0), "had": had})

    # -- what happens to the cluster

    def bodies(self, names: Sequence[str], kind: NoticeKind = NoticeKind.INTERRUPTION, state: str = "") -> list[str]:
        now = self.sim.clock.now()
        out = []
        for n in names:
            event_id = str(uuid.uuid4())
            self.sent.append(Sent(event_id, n, kind))
            out.append(eventbridge(kind, objects.instance_id(n), event_id, now, state))
        return out

    def notify(self, names: Sequence[str], kind: NoticeKind = NoticeKind.INTERRUPTION) -> None:
        self.arm()
        self.queue.send(self.bodies(names, kind))

    def interrupt(self, names: Sequence[str], *, reclaim_after: float = RECLAIM_AFTER) -> None:
        """EC2's interruption warning for ``names`` now, the instances terminated two minutes later."""
        self.notify(names)
        self.doomed.update(names)
        self.reclaims.append(self.sim.clock.now() + reclaim_after)
        self.sim.reclaim(names, after_seconds=reclaim_after)

    def sleep(self, sim_seconds: float) -> None:
        self.sim.clock.sleep(sim_seconds)

    # -- the end

    def leftovers(self, *, holds_ok: bool = False) -> list[str]:
        """What is not back yet (empty: everything is). ``holds_ok``: a node-added move record
        that is only a hold (the move over, the count the owner's) is back too: what a move to
        spot leaves while EC2 refuses every spot launch (it tries again after the hold)."""
        store = self.sim.store
        out: list[str] = []
        names = {n["metadata"]["name"]: n for n in store.list("nodes")[0]}
        gone = [n for n in self.doomed if n in names]
        if gone:
            out.append(f"doomed nodes still in the API: {sorted(gone)}")
        for n, obj in names.items():
            if any(t.get("key") == TAINT_KEY for t in (obj.get("spec") or {}).get("taints") or []):
                out.append(f"node {n} still tainted {TAINT_KEY}")
        for key, w in self.workload_views().items():
            if SURGE in w.annotations:
                out.append(f"{key} still has a surge record")
            record = moves.MoveRecord.of(w) if moves.MOVE in w.annotations else None
            if moves.MOVE in w.annotations and not (holds_ok and record is not None and record.held):
                out.append(f"{key} has a node-added move in progress")
            if key in self.owner and w.replicas != self.owner[key]:
                out.append(f"{key} at {w.replicas} replicas, its owner wants {self.owner[key]}")
        for h in store.list("horizontalpodautoscalers")[0]:
            name = h["metadata"]["name"]
            now = (h["spec"].get("minReplicas", 1), h["spec"]["maxReplicas"])
            if name in self.autoscalers and now != self.autoscalers[name]:
                out.append(f"autoscaler {name} at {now}, its owner set {self.autoscalers[name]}")
        for rs in store.list("replicasets")[0]:
            if SURGE_OF in (rs["metadata"].get("labels") or {}):
                out.append(f"surge copy {rs['metadata']['namespace']}/{rs['metadata']['name']} left")
        for b in store.list("poddisruptionbudgets")[0]:
            if Budget.from_json(b).ours:
                out.append(f"temporary budget {b['metadata']['namespace']}/{b['metadata']['name']} left")
        for cm in store.list("configmaps", ledger.namespace())[0]:
            if cm["metadata"]["name"].startswith(ledger.PREFIX) and cm.get("data"):
                out.append(f"ledger {cm['metadata']['name']} holds {sorted(cm['data'])}")
        live = {
            reservations.lease_name(rs["metadata"]["namespace"], rs["metadata"]["name"])
            for rs in store.list("replicasets")[0]
        }
        for lease in store.list("leases", "spotguard")[0]:
            name = lease["metadata"]["name"]
            if name.startswith("admission.") and name not in live:
                out.append(f"reservation lease {name} of a deleted ReplicaSet")
        serving = self.serving()
        short = {k: (serving.get(k, 0), n) for k, n in self.owner.items() if serving.get(k, 0) != n}
        if short:
            out.append(f"not serving their count yet (serving, wanted): {short}")
        if not out and self.queue.depth():
            out.append("messages still on the queue")
        return out

    def settle(self, timeout: float = SETTLE_TIMEOUT, *, holds_ok: bool = False) -> None:
        """Wait until everything is back (see :meth:`leftovers`); then stop the functions.
        ``timeout``: real seconds at the default TIME_SCALE (:meth:`window`)."""
        last: list[str] = []

        def back() -> bool:
            last[:] = self.leftovers(holds_ok=holds_ok)
            return not last

        wait_until(
            back,
            self.window(timeout),
            lambda: "everything back: " + "; ".join(last) + f"; told: {self.told()}",
            step=0.25,
        )
        self.recovered_at = self.sim.clock.now()
        self.stop_functions()

    def told(self, keys: Any = None) -> list[tuple[float, str, str]]:
        """What spotguard told in its Events about surges (seconds after t0, workload, message)."""
        out = []
        for e in self.sim.store.list("events")[0]:
            if e.get("reason") not in ("SpotInterruptionScaledBack", "SpotInterruptionSurge"):
                continue
            name = e["involvedObject"]["name"]
            if keys is not None and f"Deployment/shop/{name}" not in keys:
                continue
            out.append((self.event_time(e), name, str(e.get("message"))))
        return sorted(out)

    def event_time(self, event: Obj) -> float:
        """Simulated seconds after t0 when an Event was written (-1: before the first notice)."""
        with self.lock:
            at = self.events_at.get(event["metadata"]["name"])
        return -1.0 if at is None or self.t0 is None else round(at - self.t0, 1)

    def check_promise(self) -> None:
        """No Deployment ever served fewer replicas than just before the first notice; no
        StatefulSet fell below its floor; no notice lost."""
        assert self.t0 is not None, "no notice was sent"
        below = {}
        for key, had in self.before.items():
            if key == HEADROOM_KEY:
                continue  # spotguard's own placeholders: preempted by design, promised nothing
            low = self.tracker.lowest.get(key, 0)
            if key.startswith("Deployment/") and low < had:
                below[key] = (low, had)
            if key.startswith("StatefulSet/") and low < max(self.floor[key], 1):
                below[key] = (low, self.floor[key])
        dips = [d for d in self.dips if d[1] in below]
        told = [
            (self.event_time(e), e["involvedObject"]["name"], e.get("message"))
            for e in self.sim.store.list("events")[0]
            if e.get("reason") == "SpotInterruptionScaledBack"
            and f"Deployment/shop/{e['involvedObject']['name']}" in below
        ]
        assert not below, (
            f"the promise broke (lowest serving, promised): {below}; dips (t, key, serving): {dips}; "
            f"scale backs (t, workload, message): {sorted(told)}; t0 {self.sim.clock.iso(self.t0)}"
        )
        self.check_notices()

    def check_notices(self) -> None:
        """Every notice was acknowledged (queue and dead-letter queue empty) and every warning
        or recommendation for a node of the cluster got its taint."""
        assert self.queue.depth() == 0, "messages left on the queue"
        assert self.queue.depth(self.queue.dlq_url) == 0, "messages went to the dead-letter queue"
        kinds = {NoticeKind.INTERRUPTION}
        if self.cfg.rebalance_action is not config_mod.RebalanceAction.IGNORE:
            kinds.add(NoticeKind.REBALANCE)
        # A notice taints its node (a warning after a recommendation may keep the recommendation's taint).
        untainted = [(s.node, s.kind.value) for s in self.sent if s.kind in kinds and not self.taints_seen.get(s.node)]
        assert not untainted, f"notices whose node was never tainted: {untainted}"

    def figures(self) -> dict[str, Any]:
        """For the benchmark: lowest serving against before, and the time to recover."""
        assert self.t0 is not None and self.recovered_at is not None
        return {
            "lowest_serving": {k: self.tracker.lowest.get(k, 0) for k in sorted(self.before)},
            "before": dict(sorted(self.before.items())),
            "floors": {k: self.floor[k] for k in sorted(self.before)},
            "recovered_after_s": round(self.recovered_at - self.t0, 1),
            "margin_seconds": self.margins(),
        }

    def margins(self) -> dict[str, float | None]:
        """Per Deployment with pods on the spot nodes at the first notice: simulated seconds
        before the first reclaim at which its count from before the notice served on other
        nodes (negative: only after it; None: never). Issue 23 item 2's margin."""
        reclaim = min(self.reclaims) if self.reclaims else None
        out: dict[str, float | None] = {}
        for key in sorted(self.tracker.at_risk):
            if not key.startswith("Deployment/") or reclaim is None:
                continue
            covered = self.tracker.covered.get(key)
            out[key] = None if covered is None else round(reclaim - covered, 1)
        return out


def _capacity(n: Obj) -> str:
    return str(config_mod.Config().node_capacity((n.get("metadata") or {}).get("labels") or {}).value)


@contextlib.contextmanager
def chaos(
    workdir: Path,
    moto_url: str,
    *,
    cfg: config_mod.Config | None = None,
    nodes_: list[Obj] | None = None,
    drainer: bool = False,
    time_scale: float = TIME_SCALE,
    settings: sim_settings.Settings | None = None,
    interruption_in_process: bool = True,
) -> Iterator[Chaos]:
    import boto3

    sqs = boto3.client("sqs", endpoint_url=moto_url, region_name=REGION)
    with testing.running_cluster(
        nodes_ if nodes_ is not None else nodes(),
        time_scale=time_scale,
        ready_delay_seconds=READY_DELAY,
        drainer=drainer,
        settings=settings,
        # a deleted pod keeps its room for its grace period (30 s by default), as a kubelet does:
        # not the test harness's 1 s (docs/sim.md, kubelet.terminationSeconds)
        termination_seconds=(settings or sim_settings.Settings()).kubelet.termination_seconds,
    ) as sim:
        k = kube.Kube(sim.api_client())
        webhook = Webhook(sim, workdir, k)
        webhook.start()
        c = Chaos(sim, k, Queue(sqs), webhook, cfg or config_mod.Config(), workdir)
        json_log = _json_log(c) if TRACE else None
        try:
            c.load(workloads())
            c.start_functions(interruption_in_process=interruption_in_process)
            if TRACE:
                _trace_functions(c)
            yield c
        finally:
            c.stop_functions()
            webhook.stop()
            if json_log is not None:
                logging.getLogger().removeHandler(json_log)
                json_log.close()


TRACE = bool(os.environ.get("SPOTGUARD_CHAOS_LOG"))
_trace_log = logging.getLogger("tests.chaos.cluster")


def _trace(event_type: str, resource: str, obj: Obj) -> None:
    """The cluster's side in the JSON log: each change of a pod or ReplicaSet after the notice."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    owner = next((o.get("name") for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    extra: dict[str, Any] = {"event": event_type, "object": meta.get("name"), "owner": owner}
    if resource == "pods":
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        extra.update(node=spec.get("nodeName"), ready=ready, deleting=bool(meta.get("deletionTimestamp")))
    else:
        extra.update(replicas=spec.get("replicas"), ready=status.get("readyReplicas"))
    _trace_log.info(resource, extra=extra)


class _SimulatedTime(logging.Filter):
    """Stamps each record with the simulated seconds after the first notice (``t``; before
    it: negative, from the start) and the thread that logged it."""

    def __init__(self, c: Chaos) -> None:
        super().__init__()
        self.c = c
        self.start = c.sim.clock.now()

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.c.sim.clock.now()
        record.t = round(now - (self.c.t0 if self.c.t0 is not None else self.start), 2)
        record.thread_name = record.threadName
        return True


def _trace_functions(c: Chaos) -> None:
    """In the JSON log: each injected API fault (when it was answered or dropped), and when
    the spot-interruption process's handlings and reconciles start and end."""
    from spotguard_sim import errors as sim_errors
    from spotguard_sim import faults as sim_faults

    check = c.sim.faults.check

    def traced_check(verb: str, resource: str) -> None:
        try:
            check(verb, resource)
        except (sim_faults.DropConnection, sim_errors.StatusError) as exc:
            _trace_log.info("fault", extra={"verb": verb, "resource": resource, "fault": type(exc).__name__})
            raise

    c.sim.faults.check = traced_check
    if c.interruption is None:
        return
    handler = c.interruption.handler
    handle, reconcile = handler.handle, handler.reconcile

    def traced_handle(notices: Any, **kw: Any) -> Any:
        _trace_log.info("handling starts", extra={"notices": len(notices)})
        try:
            return handle(notices, **kw)
        finally:
            _trace_log.info("handling ends", extra={"notices": len(notices)})

    def traced_reconcile(*args: Any, **kw: Any) -> Any:
        _trace_log.info("reconcile starts")
        try:
            return reconcile(*args, **kw)
        finally:
            _trace_log.info("reconcile ends")

    handler.handle = traced_handle  # type: ignore[method-assign]
    handler.reconcile = traced_reconcile  # type: ignore[method-assign]


def _json_log(c: Chaos) -> logging.Handler:
    """``SPOTGUARD_CHAOS_LOG=1``: every log record of the functions (INFO and up, the
    spotguard and tests.chaos loggers) as one JSON line in ``<workdir>/functions.jsonl``,
    for reading back the sequence of a broken case."""
    from spotguard.logs import JsonFormatter

    handler = logging.FileHandler(c.workdir / "functions.jsonl")
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_SimulatedTime(c))
    handler.setLevel(logging.INFO)
    for name in ("spotguard", "tests.chaos"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    return handler
