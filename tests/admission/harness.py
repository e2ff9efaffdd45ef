"""What the end-to-end admission tests share: a simulated cluster with served webhooks.

``served(scenario, ...)`` starts the simulated cluster, ``count`` real
``spotguard serve admission`` processes (gunicorn, TLS) with default settings
(but the review deadline, :data:`LOADED_MACHINE`) unless ``env`` says otherwise,
a round-robin balancer in front of them when there are several, and registers
the shipped webhook configuration.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from spotguard.admission import registration
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects, testing

from tests.admission import balancer, burst, servers

NS = "shop"
PLACEMENT = "spotguard.io/placement"
DEFAULTS = config.Config()
# A test machine shared with other work is a control plane far slower than a real one: at a
# load of 20 on 2 cores a webhook's first review (three API round trips) has taken over
# 2 s and failed open. The servers get the review deadline of a slow control plane, and the
# webhook the longest timeout, unless a test is about the deadline (it sets its own). The
# simulated API server, the webhook's client, is as slow to finish a TLS handshake or send
# a request: the server waits on it as long as the webhook's timeout lets it wait.
LOADED_MACHINE = {"SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "10", "SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS": "30"}
TIMEOUT_SECONDS = 30


@dataclass
class Served:
    k: kube.Kube
    sim: Any
    servers: list[servers.Server]
    url: str
    tls: Any


@contextlib.contextmanager
def served(
    scenario: list[dict[str, Any]],
    workdir: Path,
    *,
    count: int = 1,
    env: dict[str, str] | None = None,
    workers: int = 1,
    threads: int = 8,
    server_args: list[str] | None = None,
    extra_env: list[dict[str, str]] | None = None,
    timeout_seconds: int = TIMEOUT_SECONDS,
    before_servers: Callable[[Any], None] | None = None,
) -> Iterator[Served]:
    """``before_servers(sim)``: runs once the cluster is up, before the servers start (and
    read the nodes)."""
    tls = servers.make_certs(workdir / "tls")
    with testing.running_cluster(scenario, termination_seconds=0.2) as sim, contextlib.ExitStack() as stack:
        if before_servers is not None:
            before_servers(sim)
        running: list[servers.Server] = []
        for i in range(count):
            process_env = {**LOADED_MACHINE, **(env or {}), **((extra_env or [{}] * count)[i])}
            running.append(
                stack.enter_context(
                    servers.running(
                        tls, workdir, kubeconfig=sim.kubeconfig, workers=workers, threads=threads, env=process_env
                    )
                )
            )
        if count > 1:
            lb = balancer.Balancer([("127.0.0.1", int(s.url.rsplit(":", 1)[1])) for s in running])
            stack.callback(lb.close)
            url = f"https://127.0.0.1:{lb.port}/mutate"
        else:
            url = running[0].url + "/mutate"
        k = kube.Kube(sim.api_client())
        ca = base64.b64encode(Path(tls.ca_cert).read_bytes()).decode()
        hook = registration.webhook_configuration(url, ca, timeoutSeconds=timeout_seconds)
        k.create(r.MUTATINGWEBHOOKCONFIGURATIONS, hook)
        yield Served(k, sim, running, url, tls)


def node(
    name: str, labels: dict[str, str], zone: str = "us-east-1a", taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """A node labelled only as a provider labels it (no ``node.kubernetes.io/capacity``)."""
    return objects.node(name, None, zone=zone, labels=labels, taints=taints, cpu="64", memory="256Gi", pods="250")


def template(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    containers = [objects.container("app", "nginx:1.27", cpu="10m", memory="16Mi")]
    return objects.pod_template(
        name, containers=containers, annotations=annotations or {}, terminationGracePeriodSeconds=0, **spec
    )


def deployment(name: str, replicas: int, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return objects.deployment(
        name, replicas, namespace=NS, template=template(name, **spec), annotations=annotations or {}
    )


def statefulset(name: str, replicas: int, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return objects.statefulset(
        name, replicas, namespace=NS, template=template(name, **spec), annotations=annotations or {}, policy="Parallel"
    )


def wait_for(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def live_pods(k: kube.Kube, app: str) -> list[dict[str, Any]]:
    return [
        p
        for p in k.list(r.PODS, NS, label_selector=f"app={app}")
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def capacities(k: kube.Kube) -> dict[str, Capacity]:
    """Every node's capacity, as the default settings classify its labels."""
    return {n["metadata"]["name"]: DEFAULTS.node_capacity(n["metadata"].get("labels") or {}) for n in k.list(r.NODES)}


def running(k: kube.Kube, app: str, replicas: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The ``replicas`` live pods of ``app`` once every one of them is Running."""

    def done() -> bool:
        pods = k.list(r.PODS, NS, label_selector=f"app={app}")
        return len(pods) == replicas and all(
            (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            for p in pods
        )

    wait_for(done, timeout, f"{replicas} Running pods of {app}")
    return live_pods(k, app)


def on_demand(k: kube.Kube, pods: list[dict[str, Any]]) -> tuple[int, int]:
    """(on-demand by the node's capacity, on-demand by the placement label); every pod must be placed."""
    caps = capacities(k)
    assert all(PLACEMENT in (p["metadata"].get("labels") or {}) for p in pods), "a pod was admitted unpatched"
    by_node = sum(1 for p in pods if caps.get(p["spec"].get("nodeName", "")) is Capacity.ON_DEMAND)
    by_label = sum(1 for p in pods if p["metadata"]["labels"][PLACEMENT] == "on-demand")
    return by_node, by_label


def failed_open(s: Served) -> str:
    """Every review the servers let through undecided (``failed_open``/``shed``) with the
    lines their logs give for it: "" when there is none, so ``assert not failed_open(s), ...``
    says why a review failed open when one did."""
    counted = sum(
        metric(server, "spotguard_admission_requests_total", outcome=outcome)
        for server in s.servers
        for outcome in burst.UNDECIDED
    )
    if not counted:
        return ""
    said = []
    for server in s.servers:
        lines = server.log.read_text(errors="replace").splitlines()
        undecided = [line for line in lines if '"level": "error"' in line or "review shed" in line]
        # and what the server said before (the reads not answered, the degraded answers)
        said += [*undecided[-10:], "-- the server's last lines:", *lines[-30:]]
    return f"{counted:g} review(s) let through undecided:\n" + "\n".join(said)


def metric(server: servers.Server, name: str, **labels: str) -> float:
    text = requests.get(server.url + "/metrics", verify=server.ca, timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
