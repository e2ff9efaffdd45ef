"""On-demand headroom end to end: node-added keeps low-priority placeholders that a surge preempts.

The functions are served as Knative delivers to them (CloudEvents over HTTP: node-added's
PingSource pings, the spot-interruption notice as an SQS source's event), each as its service
account with the roles the Helm chart ships (the simulated cluster authorizes every request as
kube-apiserver's RBAC does), on a Karpenter cluster (launch to Ready in 30-40 s, docs/sim.md)
where every pod is placed by the served admission webhook. web (3) and api (2) have replicas of
1.5 CPU: each floor pod fills its on-demand m5.large, so the surge of a spot node's replicas finds
no on-demand room unless the headroom holds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.interruption import app as interruption_app
from spotguard.interruption import dispatch
from spotguard.interruption.handler import Handler
from spotguard.nodeadded import app as node_added_app
from spotguard.nodeadded import reconciler, service
from spotguard.ops import functions
from spotguard.policy import config
from spotguard.policy.headroom import LABEL, NAME, PRIORITY, Cover
from spotguard_sim import capacity, readiness, testing
from spotguard_sim import settings as settings_mod
from werkzeug.serving import make_server

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h
from tests.nodeadded import test_launch_e2e as launch
from tests.security import test_rbac

ROOT = Path(__file__).resolve().parents[2]
PRIORITY_CLASS = ROOT / "infra" / "kubernetes" / "common" / "priorityclass-headroom.yaml"
EVENTS = ROOT / "tests" / "events"
SCALE = 20.0
READY_DELAY = 10.0
NOTICE = 120.0  # the reclaim, simulated seconds after the notice
NS = launch.NS
WEB = "web"
API = "api"
KARPENTER_POOL = "karpenter.sh/nodepool"

Obj = dict[str, Any]


def shipped_priority_class() -> Obj:
    obj: Obj = yaml.safe_load(PRIORITY_CLASS.read_text())
    return obj


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """A WSGI app on loopback (as ``spotguard serve`` runs it); yields its URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="served-function", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


@contextlib.contextmanager
def served_node_added(sim: Any, k: kube.Kube, cfg: config.Config | Callable[[], config.Config]) -> Iterator[Any]:
    """node-added's HTTP app with ``k`` (a service account's client) on the simulated clock;
    yields the sender of Knative's CloudEvents to it (pings) and its URL."""
    svc = service.Service(
        lambda: reconciler.Reconciler(
            k, cfg, clock=sim.clock.now, admission_cache_seconds=h.admission_cache_seconds(sim)
        ),
        join_wait=2.0,
        poll=0.05,
    )
    with served(node_added_app.create_app(svc)) as url:
        sender = functions.CloudEventsNodeAdded(url + "/", sim.url)
        try:
            yield sender, url
        finally:
            sender.close()


@contextlib.contextmanager
def served_spot_interruption(sim: Any, k: kube.Kube) -> Iterator[str]:
    handler = dispatch.Serialized(Handler(k, config.Config(), clock=sim.clock.now))
    with served(interruption_app.create_app(handler)) as url:
        yield url


def notice(url: str, sim: Any, node: Obj) -> None:
    """The EC2 spot interruption warning for ``node``, as Knative's SQS source delivers it."""
    event = json.loads((EVENTS / "ec2-spot-instance-interruption-warning.json").read_text())
    event["detail"]["instance-id"] = node["spec"]["providerID"].rsplit("/", 1)[-1]
    event["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sim.clock.now()))
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "headroom-1",
        "ce-source": "test",
        "ce-type": "dev.knative.eventing.aws-sqs",
        "Content-Type": "application/json",
    }
    answer = requests.post(url + "/", data=json.dumps(event), headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.content)["data"]["result"] == "done", answer.text


def metric(url: str, name: str, **labels: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def live(store: Any, namespace: str, selector: Callable[[Obj], bool] = lambda p: True) -> list[Obj]:
    return [p for p in store.list("pods", namespace)[0] if h.live(p) and selector(p)]


def app(pod: Obj) -> str:
    return str((pod["metadata"].get("labels") or {}).get("app") or "")


def ready_of(store: Any, name: str) -> int:
    return len(live(store, NS, lambda p: app(p) == name and readiness.is_ready(p)))


def placeholders(store: Any) -> list[Obj]:
    return live(store, "spotguard", lambda p: (p["metadata"].get("labels") or {}).get(LABEL) == "true")


def running_on(pods: list[Obj]) -> set[str]:
    return {p["spec"]["nodeName"] for p in pods if readiness.is_ready(p)}


class Serving:
    """When web's Ready pods away from the doomed node were back at its count (simulated time),
    followed on every change of the store; and every placeholder pod that was deleted."""

    def __init__(self, sim: Any, doomed: str, count: int) -> None:
        self.sim, self.doomed, self.count = sim, doomed, count
        self.lock = threading.Lock()
        self.back_at: float | None = None
        self.placeholders_deleted: set[str] = set()

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        if resource != "pods":
            return
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == "spotguard" and (event_type == "DELETED" or meta.get("deletionTimestamp")):
            with self.lock:
                self.placeholders_deleted.add(str(meta.get("name")))
        if meta.get("namespace") != NS:
            return
        serving = live(
            self.sim.store,
            NS,
            lambda p: (
                p["metadata"]["labels"].get("app") == WEB
                and readiness.is_ready(p)
                and p["spec"].get("nodeName") != self.doomed
            ),
        )
        with self.lock:
            if self.back_at is None and len(serving) >= self.count:
                self.back_at = self.sim.clock.now()


@dataclasses.dataclass
class Outcome:
    margin: float  # simulated seconds between web's count Ready away from the doomed node and the reclaim
    replacement_nodes: set[str]  # where web's replacements run
    nodes_before: set[str]  # the nodes at the notice
    placeholders_before: set[str]  # where the placeholders ran at the notice
    placeholders_after: set[str]  # where they run once launched for again
    preempted: int  # placeholder pods deleted after the notice
    priorities: set[tuple[int, str]]  # (spec.priority, spec.preemptionPolicy) of the placeholders at the notice


def cycle(tmp_path: Path, cover: Cover) -> Outcome:
    """web placed; node-added served under the Helm roles with ``cover`` until its headroom runs;
    then a notice for the spot node with the most of web's replicas, the reclaim 120 s later."""
    cfg = config.Config(headroom=cover)
    objs = [
        launch.NODE_CLASS,
        launch.nodepool("spot", "on-demand"),
        sim_scenario.namespace(NS),
        sim_scenario.namespace("spotguard"),
        shipped_priority_class(),
    ]
    # Karpenter's batch windows at 10 s idle, 20 s at most (BATCH_IDLE_DURATION and
    # BATCH_MAX_DURATION, settings a user may give it): web's two spot replicas, marked
    # unschedulable a few simulated seconds apart on a loaded machine (at x20, a real tenth of a
    # second is two simulated seconds), are launched for in one batch, so on one spot node, as
    # the case needs; at the default 1 s idle they were two nodes once under a double-loaded run
    batched = settings_mod.Settings(capacity=capacity.Capacity(batch_idle=10.0, batch_max=20.0))
    with (
        testing.running_cluster(objs, time_scale=SCALE, ready_delay_seconds=READY_DELAY, settings=batched) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        roles = test_rbac.install_rbac(sim, "helm", tmp_path)
        # web, then api: api's spot replica finds no room on web's spot node (a second spot node)
        for name, replicas in ((WEB, 3), (API, 2)):
            sim.store.apply_objects([launch.deployment(name, replicas, cpu="1500m")])
            h.wait_until(lambda n=name, c=replicas: ready_of(sim.store, n) == c, 90, f"{name} Ready")
        caps = launch.capacity_of(sim.store)
        spot = {}
        for p in live(sim.store, NS):
            if caps[p["spec"]["nodeName"]] == "spot":
                spot.setdefault(p["spec"]["nodeName"], []).append(app(p))
        assert len(spot) == 2 and sorted(map(len, spot.values())) == [1, 2], spot  # each floor on on-demand
        doomed = max(spot, key=lambda n: len(spot[n]))
        at_risk = len(spot[doomed])  # largest-node: 2 placeholders of 1.5 CPU
        assert spot[doomed] == [WEB, WEB], spot
        with (
            served_node_added(sim, kube.connect(roles["node-added"]), cfg) as (sender, node_added_url),
            served_spot_interruption(sim, kube.connect(roles["spot-interruption"])) as interruption_url,
        ):
            errors = metric(node_added_url, "spotguard_nodeadded_errors_total", step="headroom")
            if cover is not Cover.OFF:
                # WHEN node-added passes: the placeholders run on an on-demand node Karpenter launched
                h.ping_until(sender, lambda: len(running_on(placeholders(sim.store))) > 0
                             and len([p for p in placeholders(sim.store) if readiness.is_ready(p)]) == at_risk,
                             120, "the placeholders running")  # fmt: skip
            else:
                for _ in range(3):
                    sender.ping()
            # (under the Helm roles: no write refused)
            assert metric(node_added_url, "spotguard_nodeadded_errors_total", step="headroom") == errors
            before = placeholders(sim.store)
            nodes_before = {n["metadata"]["name"] for n in sim.store.list("nodes")[0]}
            watch = Serving(sim, doomed, 3)
            sim.store.subscribe(watch.on_change)
            try:
                reclaim_at = sim.clock.now() + NOTICE
                notice(interruption_url, sim, sim.store.get("nodes", doomed))
                sim.reclaim([doomed], after_seconds=NOTICE)
                h.wait_until(lambda: watch.back_at is not None, 120, "web's count Ready away from the doomed node")
                if cover is not Cover.OFF:
                    # the preempted placeholders are Pending until Karpenter launched room for them again
                    # (now for the surge of api's spot node: one placeholder)
                    h.ping_until(sender, lambda: len([p for p in placeholders(sim.store) if readiness.is_ready(p)])
                                 == 1 and running_on(placeholders(sim.store)) - nodes_before,
                                 120, "the placeholders running again")  # fmt: skip
            finally:
                sim.store.unsubscribe(watch.on_change)
            assert watch.back_at is not None
            replacements = live(
                sim.store, NS, lambda p: app(p) == WEB and p["spec"].get("nodeName") not in (None, doomed)
            )
            return Outcome(
                margin=reclaim_at - watch.back_at,
                replacement_nodes={p["spec"]["nodeName"] for p in replacements if readiness.is_ready(p)},
                nodes_before=nodes_before,
                placeholders_before=running_on(before),
                placeholders_after=running_on(placeholders(sim.store)),
                preempted=len(watch.placeholders_deleted & {p["metadata"]["name"] for p in before}),
                priorities={(p["spec"].get("priority"), p["spec"].get("preemptionPolicy")) for p in before},
            )


@pytest.mark.timeout(600)
def test_a_surge_takes_the_headroom_at_once_and_the_placeholders_get_room_launched_again(tmp_path: Path) -> None:
    # GIVEN web (3 x 1.5 CPU: floor 1 on on-demand, 2 on a spot node) and api (2: 1 on on-demand,
    # 1 on another spot node) on a Karpenter cluster, node-added keeping headroom for the spot node
    # whose reclaim needs the most (web's: 2 placeholders of 1.5 CPU)
    with_headroom = cycle(tmp_path / "on", Cover.LARGEST_NODE)
    # THEN before the notice the placeholders ran on an on-demand node Karpenter launched
    on_demand = {n for n in with_headroom.nodes_before if n in with_headroom.placeholders_before}
    assert on_demand and with_headroom.placeholders_before <= with_headroom.nodes_before
    # (their priority from the shipped PriorityClass: below every workload, never preempting)
    assert with_headroom.priorities == {(PRIORITY, "Never")}
    # AND at the notice the surge took their room: web's replacements run on nodes that were there
    # at the notice (no launch waited for), the placeholders were preempted ...
    assert with_headroom.replacement_nodes <= with_headroom.nodes_before, with_headroom
    assert with_headroom.preempted > 0, with_headroom
    # ... and, for the spot node still at risk, run again on on-demand room Karpenter launched after
    # the notice
    assert with_headroom.placeholders_after - with_headroom.nodes_before, with_headroom

    # GIVEN the same cluster without headroom
    without = cycle(tmp_path / "off", Cover.OFF)
    # THEN the surge waited for an on-demand node launched after the notice ...
    assert without.replacement_nodes - without.nodes_before, without
    # ... and web's count was Ready elsewhere later before the reclaim than with the headroom
    assert with_headroom.margin > without.margin, (with_headroom.margin, without.margin)


# -- on fixed nodes: what is written, and when a write is refused ------------------------------


def ping(url: str) -> dict[str, Any]:
    """One pass of the served node-added function (a PingSource's event); its answer's data."""
    sample = json.loads((EVENTS / "cloudevent-ping.binary.json").read_text())
    answer = requests.post(url + "/", headers=sample["headers"], data=sample["body"], timeout=120)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = json.loads(answer.content)["data"]
    assert data["result"] == "reconciled", data
    return data


@contextlib.contextmanager
def fixed_cluster(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """web (3 x 500m: 1 on on-demand, 2 on spot) on fixed nodes, placed by the served webhook; the
    Helm roles installed (their kubeconfigs by function)."""
    objs = [*sim_scenario.mixed_nodes(on_demand=1, spot=1), shipped_priority_class()]
    with (
        testing.running_cluster(objs, time_scale=SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        roles = test_rbac.install_rbac(sim, "helm", tmp_path)
        sim.store.apply_objects([launch.deployment(WEB, 3)])
        h.wait_until(lambda: ready_of(sim.store, WEB) == 3, 60, "web Ready")
        assert h.placement(sim.store)[f"Deployment/{NS}/{WEB}"] == (1, 2, 0)
        yield sim, roles


class Writes:
    """Every change of a Deployment in spotguard's namespace."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        if resource == "deployments" and (obj.get("metadata") or {}).get("namespace") == "spotguard":
            self.seen.append((event_type, str(obj["metadata"].get("name"))))


def headroom_deployment(store: Any) -> Obj | None:
    found = [d for d in store.list("deployments", "spotguard")[0] if d["metadata"]["name"] == NAME]
    return found[0] if found else None


def test_headroom_off_writes_nothing_and_turning_it_off_removes_the_placeholders(tmp_path: Path) -> None:
    with fixed_cluster(tmp_path) as (sim, roles):
        settings = [config.Config()]  # the default: off
        writes = Writes()
        sim.store.subscribe(writes.on_change)
        try:
            with served_node_added(sim, kube.connect(roles["node-added"]), lambda: settings[0]) as (_, url):
                # GIVEN web's 2 spot replicas at risk, WHEN node-added passes with the headroom off
                written = metric(url, "spotguard_nodeadded_headroom_writes_total")
                for _ in range(3):
                    ping(url)
                # THEN it writes nothing for it: no Deployment in its namespace, no write counted
                assert writes.seen == [] and headroom_deployment(sim.store) is None
                assert metric(url, "spotguard_nodeadded_headroom_writes_total") == written
                assert metric(url, "spotguard_nodeadded_headroom_placeholders", state="kept") == 0

                # WHEN it is turned on (every spot node): 2 placeholders of web's size, on on-demand
                settings[0] = config.Config(headroom=Cover.ALL_SPOT)
                ping(url)
                made = headroom_deployment(sim.store)
                assert made is not None and made["spec"]["replicas"] == 2
                [container] = made["spec"]["template"]["spec"]["containers"]
                assert container["resources"]["requests"] == {"cpu": "500m", "memory": str(256 * 2**20)}
                assert "karpenter.sh/do-not-disrupt" not in (
                    made["spec"]["template"]["metadata"].get("annotations") or {}
                )
                h.wait_until(lambda: running_on(placeholders(sim.store)) == {"od-0"}
                             and len(placeholders(sim.store)) == 2, 60, "the placeholders on od-0")  # fmt: skip
                assert metric(url, "spotguard_nodeadded_headroom_placeholders", state="kept") == 2
                # a pass that finds it as wanted writes nothing (its spec's generation stays)
                written = metric(url, "spotguard_nodeadded_headroom_writes_total")
                ping(url)
                assert metric(url, "spotguard_nodeadded_headroom_writes_total") == written
                assert headroom_deployment(sim.store)["metadata"]["generation"] == made["metadata"]["generation"]

                # WHEN nothing is at risk any more (web scaled to its on-demand floor) THEN it is scaled
                # to 0, its template kept for when something is at risk again
                kube.Kube(sim.api_client()).patch(r.DEPLOYMENTS, WEB, {"spec": {"replicas": 1}}, NS)
                h.wait_until(lambda: h.placement(sim.store)[f"Deployment/{NS}/{WEB}"] == (1, 0, 0), 60, "web at 1")
                ping(url)
                idle = headroom_deployment(sim.store)
                assert idle is not None and idle["spec"]["replicas"] == 0
                assert idle["spec"]["template"]["spec"]["containers"] == made["spec"]["template"]["spec"]["containers"]
                h.wait_until(lambda: not placeholders(sim.store), 60, "the placeholders gone")
                ping(url)  # and stays so, unwritten
                assert headroom_deployment(sim.store)["metadata"]["generation"] == idle["metadata"]["generation"]

                # WHEN it is turned off again THEN the Deployment and its placeholders are gone
                settings[0] = config.Config()
                ping(url)
                assert headroom_deployment(sim.store) is None
                h.wait_until(lambda: not placeholders(sim.store), 60, "the placeholders gone")
                assert metric(url, "spotguard_nodeadded_headroom_placeholders", state="kept") == 0
        finally:
            sim.store.unsubscribe(writes.on_change)


CREATE_DEPLOYMENTS = {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}
ROLE = r.Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True)


def test_a_refused_write_leaves_the_pass_working_and_the_next_pass_writes_it(tmp_path: Path) -> None:
    with fixed_cluster(tmp_path) as (sim, roles):
        admin = kube.Kube(sim.api_client())
        shipped = admin.get(ROLE, "spotguard-node-added", "spotguard")
        # GIVEN the node-added Role without its grant to create the headroom Deployment
        role = json.loads(json.dumps(shipped))
        role["rules"] = [rule for rule in role["rules"] if rule != CREATE_DEPLOYMENTS]
        assert len(role["rules"]) == len(shipped["rules"]) - 1
        admin.replace(ROLE, role)
        cfg = config.Config(headroom=Cover.LARGEST_NODE)
        with served_node_added(sim, kube.connect(roles["node-added"]), cfg) as (_, url):
            errors = metric(url, "spotguard_nodeadded_errors_total", step="headroom")
            # WHEN node-added passes THEN the pass is done (its answer, its other work), the refused
            # write is counted and logged, and nothing is created
            answer = ping(url)
            assert answer["failures"] >= 1, answer
            assert metric(url, "spotguard_nodeadded_errors_total", step="headroom") == errors + 1
            assert metric(url, "spotguard_nodeadded_headroom_placeholders", state="wanted") == 2
            assert metric(url, "spotguard_nodeadded_headroom_placeholders", state="kept") == 0
            assert headroom_deployment(sim.store) is None
            # the spot node still got its label this pass (the pass went on)
            assert sim.store.get("nodes", "spot-0")["metadata"]["labels"].get("spotguard.io/spot") == "true"
            # WHEN the shipped grant is back THEN the next pass creates it
            current = admin.get(ROLE, "spotguard-node-added", "spotguard")
            shipped["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            admin.replace(ROLE, shipped)
            ping(url)
            made = headroom_deployment(sim.store)
            assert made is not None and made["spec"]["replicas"] == 2


def test_a_deployment_of_that_name_spotguard_did_not_make_is_left_alone(tmp_path: Path) -> None:
    with fixed_cluster(tmp_path) as (sim, roles):
        # GIVEN someone's own Deployment named spotguard-headroom in spotguard's namespace
        theirs = launch.deployment(NAME, 1)
        theirs["metadata"]["namespace"] = "spotguard"
        sim.store.apply_objects([theirs])
        before = headroom_deployment(sim.store)
        assert before is not None
        cfg = config.Config(headroom=Cover.ALL_SPOT)
        with served_node_added(sim, kube.connect(roles["node-added"]), cfg) as (_, url):
            # WHEN node-added passes with the headroom on, and then off
            ping(url)
            ping(url)
        with served_node_added(sim, kube.connect(roles["node-added"]), config.Config()) as (_, url):
            ping(url)
        # THEN theirs is as it was: neither resized, nor given a template, nor deleted
        after = headroom_deployment(sim.store)
        assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["spec"]["replicas"] == 1
