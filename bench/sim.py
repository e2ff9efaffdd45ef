"""Benchmark the simulated cluster: 1,000 nodes, 20,000 pods.

Creates Deployments over HTTPS with the official client, then measures how fast
pods are created (by the ReplicaSet controller, through admission), scheduled
and Ready; then, from a separate client process, lists all pods the way
spotguard does: through its gateway, ``spotguard.gateway.kube.Kube(api_client)
.list(resources.PODS)`` (pages of 500 following ``continue``, orjson, the
garbage collector paused). ``--webhook`` adds a MutatingWebhookConfiguration
that calls a local HTTPS webhook (allowing with a small JSONPatch) for every pod.
``--spread`` gives the pods the constraints spotguard's admission patch gives them
(``spotguard.policy.patches.build`` applied to each Deployment's template, with the default
``Config``): three Deployments in four are spot slots (the preferred spot node affinity, the
spot tolerations, and soft topology spread over the hostname, the zone and the spot-only
``spotguard.io/spot`` key, maxSkew 1, ScheduleAnyway), the fourth is a floor (the required
on-demand node affinity); the spot nodes carry ``spotguard.io/spot=true`` as node-added
labels them.

Prints ONE JSON line at the end:
``{"nodes", "pods", "pods_per_second", "created_per_second", "scheduled_per_second",
"ready_per_second", "list_pods_seconds", "list_pods_deserialized_seconds", ...}``:
``list_pods_seconds`` is the gateway's ``Kube.list`` of every pod (the median of three;
``list_pods_gateway_runs`` has all three and ``list_pods_gateway_requests`` the pages
it took). Beside it, with the official client and one unpaged request:
``list_pods_http_seconds`` is the request alone (``_preload_content=False``),
``list_pods_orjson_seconds`` the request plus ``orjson.loads``,
``list_pods_json_seconds`` the request plus the standard ``json.loads``, and
``list_pods_deserialized_seconds`` the client's model objects.
``calibration_loop_seconds`` (a fixed pure-Python loop, about 0.1 s on an idle core)
and ``load_average`` tell how busy the machine was.

    .venv/bin/python bench/sim.py [--nodes 1000] [--pods 20000] [--webhook] [--spread]
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any

import jsonpatch
import kubernetes
from spotguard.policy import patches
from spotguard.policy.config import Config
from spotguard.policy.placement import Placement
from spotguard_sim import objects, testing, tls
from spotguard_sim import settings as sim_settings


class Counters:
    """Counts pod transitions from store notifications (no polling of the store)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created = 0
        self.scheduled: set[str] = set()
        self.ready: set[str] = set()
        self.times: dict[str, float] = {}

    def __call__(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or event_type == "DELETED":
            return
        name = obj["metadata"]["name"]
        now = time.monotonic()
        with self.lock:
            if event_type == "ADDED":
                self.created += 1
                self.times["created"] = now
            if obj["spec"].get("nodeName") and name not in self.scheduled:
                self.scheduled.add(name)
                self.times["scheduled"] = now
            ready = name not in self.ready and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (obj.get("status") or {}).get("conditions") or [])
            if ready:
                self.ready.add(name)
                self.times["ready"] = now


def node(i: int, spread: bool = False) -> dict[str, Any]:
    zone = f"us-east-1{'abc'[i % 3]}"
    spot = i % 4 != 0
    return objects.node(
        f"node-{i:04d}",
        "spot" if spot else "on-demand",
        zone=zone,
        provider=objects.provider_id(zone, objects.instance_id(i)),
        labels={patches.SPOT_NODE_LABEL: patches.SPOT_NODE_VALUE} if spread and spot else None,
        ready_reason="KubeletReady",
    )


def spotguard_shaped(template: dict[str, Any], placement: Placement) -> dict[str, Any]:
    """The template as spotguard's admission patch leaves a pod of ``placement``."""
    ops = patches.build(template, placement, Config(), spot_key=patches.SPOT_NODE_LABEL)
    patched: dict[str, Any] = jsonpatch.JsonPatch(ops).apply(template, in_place=False)
    return patched


def deployment(i: int, replicas: int, spread: bool = False) -> dict[str, Any]:
    app = f"app-{i:03d}"
    spec: dict[str, Any] = {}
    if i % 2 == 0:  # half of the workloads spread softly over zones
        spec["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": app}},
        }]
    containers = [objects.container("web", "nginx:1.27", cpu="100m", memory="128Mi")]
    template = objects.pod_template(app, containers=containers, **spec)
    if spread:  # three in four spot slots, the fourth a floor
        template = spotguard_shaped(template, Placement.ON_DEMAND if i % 4 == 3 else Placement.SPOT)
    return objects.deployment(app, replicas, namespace="bench", template=template)


class _Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = 0

    def do_POST(self) -> None:
        review = testing.read_review(self)
        patch = [{"op": "add", "path": "/metadata/annotations",
                  "value": {"bench.spotguard.io/admitted": "true"}}]
        type(self).calls += 1
        testing.answer_review(self, {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                                     "patch": base64.b64encode(json.dumps(patch).encode()).decode()})

    def log_message(self, *args: Any) -> None:
        pass


def start_webhook() -> tuple[http.server.ThreadingHTTPServer, dict[str, Any]]:
    server, url, ca_bundle = tls.serve_https(_Hook)
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "bench"},
        "webhooks": [{
            "name": "bench.spotguard.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"url": url + "/mutate", "caBundle": ca_bundle},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
        }],
    }
    return server, config


LIST_SCRIPT = r"""
import json, sys, time
import kubernetes
api = kubernetes.config.new_client_from_config(config_file=sys.argv[1])
core = kubernetes.client.CoreV1Api(api)
out = {}
core.list_namespace()  # connect (TLS handshake) first
t0 = time.monotonic()
raw = core.list_pod_for_all_namespaces(_preload_content=False)
data = raw.data
out["list_pods_http_seconds"] = round(time.monotonic() - t0, 3)
items = json.loads(data)["items"]
out["list_pods_json_seconds"] = round(time.monotonic() - t0, 3)
out["listed_pods"] = len(items)
out["list_pods_bytes"] = len(data)
# The request parsed with orjson (what the gateway does per page), one unpaged request.
import orjson
t0 = time.monotonic()
data = core.list_pod_for_all_namespaces(_preload_content=False).data
orjson.loads(data)
out["list_pods_orjson_seconds"] = round(time.monotonic() - t0, 3)
del data, items
# What spotguard does: list every pod through its gateway.
from spotguard.gateway import kube, resources
gateway = kube.Kube(api)
gateway.list(resources.NAMESPACES)  # reconnect (Kube re-tunes the client's pool)
runs = []
for _ in range(3):
    before = gateway.stats.requests
    t0 = time.monotonic()
    pods = gateway.list(resources.PODS)
    runs.append(round(time.monotonic() - t0, 3))
    out["list_pods_gateway_requests"] = gateway.stats.requests - before
    out["list_pods_gateway_listed"] = len(pods)
    del pods
out["list_pods_seconds"] = sorted(runs)[1]
out["list_pods_gateway_runs"] = runs
t0 = time.monotonic()
json.loads(core.list_namespaced_pod("bench", _preload_content=False).data)
out["list_namespaced_pods_seconds"] = round(time.monotonic() - t0, 3)
t0 = time.monotonic()
typed = core.list_pod_for_all_namespaces()
out["list_pods_deserialized_seconds"] = round(time.monotonic() - t0, 3)
out["listed_pods_deserialized"] = len(typed.items)
t0 = time.monotonic()
nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
out["list_nodes_seconds"] = round(time.monotonic() - t0, 3)
out["listed_nodes"] = len(nodes)
print(json.dumps(out))
"""


def list_in_subprocess(kubeconfig: str) -> dict[str, Any]:
    """Time the lists with the official client in a separate Python process."""
    done = subprocess.run([sys.executable, "-c", LIST_SCRIPT, kubeconfig], capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"list_error": done.stderr.strip().splitlines()[-1:]}
    parsed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def calibrate() -> float:
    """Seconds a fixed pure-Python loop takes here (about 0.1 s on an idle modern core):
    the numbers above scale with it."""
    start = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return round(time.perf_counter() - start, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--replicas", type=int, default=100, help="pods per Deployment")
    parser.add_argument("--webhook", action="store_true", help="admit every pod through an HTTPS webhook")
    parser.add_argument("--spread", action="store_true",
                        help="give the pods the node affinity and topology spread spotguard's patch adds")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    deployments = max(1, args.pods // args.replicas)
    result: dict[str, Any] = {"nodes": args.nodes, "pods": deployments * args.replicas,
                              "deployments": deployments, "webhook": args.webhook,
                              "spread": args.spread,
                              "calibration_loop_seconds": calibrate(),
                              "load_average": round(os.getloadavg()[0], 2)}
    hook = None
    # The simulated cluster's own throughput: without kube-controller-manager's client rate
    # limit (kubeAPIQPS 0), which alone would hold 20,000 pods to 20 a second.
    unlimited = sim_settings.Settings(controller_manager=sim_settings.ControllerManager(kube_api_qps=0))
    with testing.running_cluster(settings=unlimited) as sim:
        store = sim.store
        for i in range(args.nodes):
            store.create("nodes", node(i, args.spread))
        store.create("namespaces", {"metadata": {"name": "bench"}})
        if args.webhook:
            hook, config = start_webhook()
            store.create("mutatingwebhookconfigurations", config)
        counters = Counters()
        store.subscribe(counters, ["pods"])  # a copy of each pod write only, not of every write
        api = sim.api_client()
        apps = kubernetes.client.AppsV1Api(api)
        total = result["pods"]
        start = time.monotonic()
        for i in range(deployments):
            apps.create_namespaced_deployment("bench", deployment(i, args.replicas, args.spread))
        result["create_deployments_seconds"] = round(time.monotonic() - start, 3)
        last_report = start
        while len(counters.ready) < total:
            now = time.monotonic()
            if now - start > args.timeout:
                result["error"] = "timed out"
                break
            if now - last_report >= 10:
                last_report = now
                print(f"# {now - start:6.1f}s created={counters.created} "
                      f"scheduled={len(counters.scheduled)} ready={len(counters.ready)}",
                      file=sys.stderr, flush=True)
            time.sleep(0.2)
        times = counters.times

        def rate(n: int, key: str) -> float:
            return round(n / max(times.get(key, start) - start, 1e-9), 1)

        result["created_per_second"] = rate(counters.created, "created")
        result["scheduled_per_second"] = rate(len(counters.scheduled), "scheduled")
        result["ready_per_second"] = rate(len(counters.ready), "ready")
        result["pods_per_second"] = result["ready_per_second"]
        result["all_ready_seconds"] = round(times.get("ready", start) - start, 2)
        if hook is not None:
            result["webhook_calls"] = _Hook.calls
        store.unsubscribe(counters)

        # list 20,000 pods over HTTPS with the official client, from another process
        # (as a real client is: no sharing of this process's GIL with the cluster)
        result.update(list_in_subprocess(sim.kubeconfig))
        stats = sim.controllers.scheduler
        result["bound_by_scheduler"] = stats.bound if stats is not None else 0
    if hook is not None:
        hook.shutdown()
    result["load_average_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
