"""Every delivery reaches the same core: the served function (binary and structured CloudEvents),
func-python's ``new()``, and the Lambda handler with events in AWS's shapes.

Each event that asks for a pass must run one against the simulated cluster: the visible
effect used here is the deletion of a reservation Lease whose ReplicaSet does not exist
(one is planted before every event). Events that ask for nothing are acknowledged and
leave it in place.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from cloudevents.core.bindings import http as ce_http
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config, patches
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects, testing

from tests.admission.servers import free_port
from tests.interruption.test_cloudevents import asgi_request
from tests.interruption.transport_support import sample

ROOT = Path(__file__).resolve().parents[2]
FUNCTION_DIR = ROOT / "functions" / "node-added"
# The node the sample events name (tests/events): ApiServerSource's Node, EC2's instance.
SAMPLE_NODE = "ip-10-0-1-23.ec2.internal"
SAMPLE_INSTANCE = "i-1234567890abcdef0"


def cluster() -> list[dict[str, Any]]:
    return [
        objects.namespace("spotguard"),
        objects.node("od-0", "on-demand", provider=objects.provider_id("us-east-1a", "i-0aaaaaaaaaaaaaaa0")),
        objects.node(SAMPLE_NODE, "spot", provider=objects.provider_id("us-east-1a", SAMPLE_INSTANCE)),
    ]


class Orphans:
    """Plants admission Leases of ReplicaSets that do not exist and tells whether a pass removed them."""

    def __init__(self, k: kube.Kube) -> None:
        self.k = k
        self.n = 0

    def plant(self) -> str:
        self.n += 1
        name = f"admission.shop.gone-{self.n}"
        self.k.create(
            r.LEASES,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": "spotguard",
                    "labels": {"app.kubernetes.io/managed-by": "spotguard", "app.kubernetes.io/component": "admission"},
                    "annotations": {
                        "spotguard.io/replicaset-uid": f"00000000-0000-0000-0000-{self.n:012d}",
                        "spotguard.io/replicaset": f"shop/gone-{self.n}",
                    },
                },
                "spec": {"holderIdentity": "spotguard-admission"},
            },
            "spotguard",
        )
        return name

    def exists(self, name: str) -> bool:
        return self.k.find(r.LEASES, name, "spotguard") is not None


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    with testing.running_cluster(cluster()) as running:
        monkeypatch.setenv("KUBECONFIG", str(running.kubeconfig))
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("SPOTGUARD_NODE_JOIN_WAIT_SECONDS", "1")
        yield running


def event(name: str) -> tuple[dict[str, str], bytes]:
    payload = sample(name)
    return payload["headers"], payload["body"].encode()


def answer_data(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    ev = ce_http.from_http_event(ce_http.HTTPMessage(headers={k.lower(): v for k, v in headers.items()}, body=body))
    assert ev.get_type() == "dev.spotguard.node-added.result"
    data = ev.get_data()
    assert isinstance(data, dict)
    return data


CLOUDEVENTS = [
    ("cloudevent-apiserversource-node.binary.json", "reconciled"),
    ("cloudevent-apiserversource-node.structured.json", "reconciled"),
    ("cloudevent-ping.binary.json", "reconciled"),
    ("cloudevent-ping.structured.json", "reconciled"),
    ("cloudevent-aws-sqs.binary.json", "foreign"),  # an interruption notice: not this function's
]


def test_served_function(sim: Any, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTGUARD_")}
    env["SPOTGUARD_NODE_JOIN_WAIT_SECONDS"] = "1"
    log = (tmp_path / "server.log").open("wb")
    args = [sys.executable, "-m", "spotguard.cli", "serve", "node-added", "--port", str(port)]
    args += ["--kubeconfig", str(sim.kubeconfig)]
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if requests.get(url + "/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        orphans = Orphans(kube.Kube(sim.api_client()))
        for name, result in CLOUDEVENTS:
            lease = orphans.plant()
            headers, body = event(name)
            answer = requests.post(url + "/", headers=headers, data=body, timeout=30)
            assert answer.status_code == 200, answer.text
            data = answer_data(dict(answer.headers), answer.content)
            assert data["result"] == result, (name, data)
            assert orphans.exists(lease) is (result != "reconciled"), name
            if "apiserversource" in name:
                # The sample Node was registered not Ready; the simulated one is Ready.
                assert data["trigger"] == {"kind": "node-added", "id": data["id"], "node": SAMPLE_NODE}
                assert data["joined"] is True
        bad = requests.post(url + "/", data=b"{}", headers={"content-type": "application/json"}, timeout=10)
        assert bad.status_code == 400 and "not a CloudEvent" in bad.text
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert 'spotguard_nodeadded_passes_total{result="done",trigger="node-added"} 2.0' in metrics
        assert 'spotguard_nodeadded_passes_total{result="done",trigger="schedule"} 2.0' in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def load(path: Path, name: str) -> ModuleType:
    package = path.is_dir()
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py" if package else path, submodule_search_locations=[str(path)] if package else None
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def lifespan(app: Any, requests_: list[tuple[str, dict[str, str], bytes]], before: Any) -> list[tuple[int, Any]]:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await asyncio.wait_for(outbox.get(), 60))["type"] == "lifespan.startup.complete"
    out = []
    for path, headers, body in requests_:
        planted = before()
        status, answer_headers, payload = await asgi_request(app, headers, body, path=path)
        if path == "/":
            out.append((status, (answer_data(answer_headers, payload), planted)))
        else:
            out.append((status, payload))
    await inbox.put({"type": "lifespan.shutdown"})
    assert (await asyncio.wait_for(outbox.get(), 10))["type"] == "lifespan.shutdown.complete"
    await task
    return out


def test_knative_function(sim: Any) -> None:
    from func_python.cloudevent import ASGIApplication

    orphans = Orphans(kube.Kube(sim.api_client()))
    app = ASGIApplication(load(FUNCTION_DIR / "function", "node_added_function").new())
    requests_ = [("/health/readiness", {}, b"")] + [("/", *event(name)) for name, _ in CLOUDEVENTS]
    answers = asyncio.run(lifespan(app, requests_, orphans.plant))
    assert answers[0] == (200, b"OK")
    for (name, result), (status, (data, lease)) in zip(CLOUDEVENTS, answers[1:], strict=True):
        assert status == 200 and data["result"] == result, (name, data)
        assert orphans.exists(lease) is (result != "reconciled"), name


LAMBDA_EVENTS = [
    ("ec2-instance-state-change-notification.running.json", "reconciled"),
    ("eventbridge-scheduled-event.json", "reconciled"),
    ("eventbridge-scheduler-input.json", "reconciled"),
    ("ec2-instance-state-change-notification.json", "ignored"),  # pending: nothing to do yet
    ("ec2-spot-instance-interruption-warning.json", "foreign"),  # the spot-interruption function's
    ("ec2-spot-instance-interruption-warning.as-documented.json", "malformed"),
]


def test_lambda_function(sim: Any) -> None:
    orphans = Orphans(kube.Kube(sim.api_client()))
    module = load(FUNCTION_DIR / "lambda_function.py", "node_added_lambda")
    for name, result in LAMBDA_EVENTS:
        lease = orphans.plant()
        answer = module.lambda_handler(sample(name), None)
        json.dumps(answer)  # what Lambda returns must be JSON
        assert answer["result"] == result, (name, answer)
        assert orphans.exists(lease) is (result != "reconciled"), name
        if name.startswith("ec2-instance-state-change-notification.running"):
            assert answer["joined"] is True and answer["trigger"]["instance_id"] == SAMPLE_INSTANCE


def test_lambda_instance_not_joined_yet(sim: Any) -> None:
    """A running instance whose node has not registered: wait within the limit, then pass anyway."""
    module = load(FUNCTION_DIR / "lambda_function.py", "node_added_lambda_2")
    payload = sample("ec2-instance-state-change-notification.running.json")
    payload["detail"]["instance-id"] = "i-0fffffffffffffff0"
    started = time.monotonic()
    answer = module.lambda_handler(payload, None)
    assert answer["result"] == "reconciled" and answer["joined"] is False
    assert time.monotonic() - started < 30  # bounded by SPOTGUARD_NODE_JOIN_WAIT_SECONDS, not forever


def test_reconcile_command_dry_run_prints_the_plan_and_writes_nothing(sim: Any, tmp_path: Path) -> None:
    """``spotguard reconcile --dry-run``: a Deployment above its floor, a Lease of a gone ReplicaSet."""
    k = kube.Kube(sim.api_client())
    k.create(r.NAMESPACES, objects.namespace("shop"))
    k.create(r.DEPLOYMENTS, objects.deployment("web", 2, namespace="shop"))
    h_wait = time.monotonic() + 30
    while len([p for p in k.list(r.PODS, "shop") if p["spec"].get("nodeName")]) < 2:
        assert time.monotonic() < h_wait, "web's pods were not scheduled"
        time.sleep(0.1)
    lease = Orphans(k).plant()
    env = {key: v for key, v in os.environ.items() if not key.startswith("SPOTGUARD_")}
    env["SPOTGUARD_REBALANCE_SETTLE_SECONDS"] = "0"
    command = [sys.executable, "-m", "spotguard.cli", "--log-level", "WARNING", "reconcile"]
    command += ["--kubeconfig", str(sim.kubeconfig), "--dry-run"]
    def written() -> tuple[Any, ...]:
        # The spec and annotations (the controllers keep writing its status: the resourceVersion moves).
        meta = k.get(r.DEPLOYMENTS, "web", "shop")["metadata"]
        return meta.get("generation"), meta.get("annotations")

    before = written()
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "dry run: nothing written" in out.stdout
    assert f"lease spotguard/{lease}: would delete" in out.stdout
    assert orphans_left(k, lease)
    assert written() == before
    # ... nor labels the spot nodes (it says it would)
    spot = Capacity.SPOT
    spot_nodes = sorted(
        n["metadata"]["name"] for n in k.list(r.NODES) if config.Config().node_capacity(n["metadata"]["labels"]) is spot
    )
    assert spot_nodes and all(f"node {n}: would label spotguard.io/spot=true" in out.stdout for n in spot_nodes)
    assert not any(patches.SPOT_NODE_LABEL in n["metadata"]["labels"] for n in k.list(r.NODES))
    # Without --dry-run the same pass writes.
    done = subprocess.run(command[:-1], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not orphans_left(k, lease)
    # ... and labels every spot node, and no other
    labelled = [n["metadata"]["name"] for n in k.list(r.NODES) if patches.SPOT_NODE_LABEL in n["metadata"]["labels"]]
    assert sorted(labelled) == spot_nodes


def orphans_left(k: kube.Kube, name: str) -> bool:
    return k.find(r.LEASES, name, "spotguard") is not None
