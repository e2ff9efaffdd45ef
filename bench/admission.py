"""Benchmark the admission webhook over HTTPS on loopback.

1. API cost: the simulated cluster calls the webhook (a ``spotguard serve
   admission`` server process, gunicorn + TLS) for every pod of a 100-replica
   Deployment; the Kubernetes API requests the webhook made are read from the
   gateway's ``spotguard_kube_requests_total`` on its /metrics, before and
   after. A 10-replica Deployment first warms the per-process caches
   (namespace, nodes, configuration), so the figure is per pod once warm
   (the new ReplicaSet's own lookups and Lease included).
2. Latency: AdmissionReviews for pods of that Deployment (floor met: the
   common case) against the webhook, and the same bodies against a no-op
   endpoint (a Flask app answering ``allowed`` under the same gunicorn
   configuration and TLS), interleaved in blocks; p50/p99 and the p99 ratio.
3. Throughput: concurrent clients against the webhook for a few seconds.
4. Burst (``--burst N``, default 400; 0 skips it): N AdmissionReviews in flight
   at once against a webhook server with its default sizing, each on its own
   new connection and with the shipped webhook timeout, as kube-apiserver sends
   a ReplicaSet's slow-start batch; each answered patch is applied and the pod
   stored, as the API server does. Reports the burst's p50/p99, errors (refused
   or reset connections, timeouts, non-200 answers, fail-opens), throughput and
   whether the on-demand pods equal the floor.

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))
sys.path.insert(0, str(ROOT))

from spotguard import certs  # noqa: E402
from spotguard.admission import core, registration, server  # noqa: E402
from spotguard.gateway import kube  # noqa: E402
from spotguard.gateway import resources as r  # noqa: E402
from spotguard_sim import objects  # noqa: E402

from tests.admission import burst as burst_sender  # noqa: E402

NS = "shop"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def noop_app() -> Any:
    import flask

    app = flask.Flask("noop")

    @app.post("/mutate")
    def mutate() -> Any:
        review = json.loads(flask.request.get_data())
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return flask.Response(json.dumps(body), mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> str:
        return "ok"

    return app


class NoopServer(server.Server):
    def load(self) -> Any:
        return noop_app()


def serve(kind: str, port: int, tls: certs.Paths, kubeconfig: str, sizes: tuple[int | None, int | None]) -> None:
    workers, threads = sizes
    os.environ["SPOTGUARD_NAMESPACE"] = "spotguard"
    sizing = {k: v for k, v in (("workers", workers), ("threads", threads)) if v is not None}
    options = server.options(host="127.0.0.1", port=port, certfile=str(tls.cert), keyfile=str(tls.key), **sizing)
    factory = lambda: core.context_from_env(dict(os.environ), kubeconfig)  # noqa: E731
    (NoopServer if kind == "noop" else server.Server)(factory, options).run()


def start(kind: str, tls: certs.Paths, kubeconfig: str, workers: int | None, threads: int | None) -> tuple[Any, str]:
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=serve, args=(kind, port, tls, kubeconfig, (workers, threads)), daemon=True
    )
    process.start()
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(url + "/healthz", verify=str(tls.ca_cert), timeout=1).ok:
                return process, url
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kind} server did not start")
        time.sleep(0.1)


def start_sim(workdir: Path, no_controllers: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    workdir.mkdir(parents=True, exist_ok=True)
    scenario_file = workdir / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump_all(scenario()))
    kubeconfig = workdir / "kubeconfig"
    command = [sys.executable, "-m", "spotguard.cli", "--log-level", "WARNING", "sim", "serve"]
    command += ["--kubeconfig", str(kubeconfig), "--scenario", str(scenario_file)]
    if no_controllers:
        command.append("--no-controllers")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        if kubeconfig.exists():
            try:
                kube.connect(str(kubeconfig)).list(r.NAMESPACES)
                return process, str(kubeconfig)
            except Exception:
                pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the simulated cluster did not start")
        time.sleep(0.2)


def kube_requests(url: str, ca: str) -> float:
    text = requests.get(url + "/metrics", verify=ca, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("spotguard_kube_requests_total{")
    )


def deployment(name: str, replicas: int) -> dict[str, Any]:
    containers = [objects.container("app", "nginx:1.27", cpu="10m", memory="16Mi")]
    return objects.deployment(name, replicas, namespace=NS, template=objects.pod_template(name, containers=containers))


def scenario() -> list[dict[str, Any]]:
    def node(name: str, capacity: str) -> dict[str, Any]:
        return objects.node(name, capacity, cpu="32", memory="128Gi", pods="250", ready=False)

    return (
        [objects.namespace(n) for n in (NS, "spotguard")]
        + [node(f"od-{i}", "on-demand") for i in range(2)]
        + [node(f"spot-{i}", "spot") for i in range(4)]
    )


def wait_pods(k: kube.Kube, app: str, n: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        pods = k.list(r.PODS, NS, label_selector=f"app={app}")
        if len(pods) == n and all("spotguard.io/placement" in p["metadata"].get("labels", {}) for p in pods):
            return pods
        if time.monotonic() > deadline:
            raise RuntimeError(f"{app}: {len(pods)} of {n} pods admitted")
        time.sleep(0.1)


def review_body(rs: dict[str, Any]) -> bytes:
    return json.dumps(burst_sender.review_of(burst_sender.pod_of(rs))).encode()


def timed_posts(session: requests.Session, url: str, body: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        response = session.post(
            url + "/mutate", data=body, headers={"Content-Type": "application/json"}, timeout=10, verify=session.verify
        )
        out.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200 or not response.json()["response"]["allowed"]:
            raise RuntimeError(f"bad answer {response.status_code}: {response.text[:200]}")
    return out


def _burst_ready() -> None:
    import jsonpatch  # noqa: F401 - imported before the burst starts, not during it


def _burst_part(job: dict[str, Any]) -> list[burst_sender.Call]:
    """One client process's share of the burst: ``n`` threads, each one review and its pod."""
    k = kube.connect(job["kubeconfig"])
    reviews = [burst_sender.review_of(burst_sender.pod_of(job["rs"])) for _ in range(job["n"])]

    def store(review: dict[str, Any], response: dict[str, Any]) -> None:
        k.create(r.PODS, burst_sender.patched(review, response), NS)

    return burst_sender.send(
        job["url"] + "/mutate", job["ca"], reviews, timeout=job["timeout"], store=store, at=job["at"]
    )


def burst(k: kube.Kube, kubeconfig: str, url: str, *, ca: str, n: int, timeout: float) -> dict[str, Any]:
    """``n`` reviews at once for a fresh ``n``-replica Deployment (floor 10%); see the docstring."""
    dep = k.create(r.DEPLOYMENTS, deployment("burst", 0), NS)
    dep = k.patch(r.DEPLOYMENTS, "burst", {"metadata": {"annotations": {"spotguard.io/min-on-demand": "10%"}}}, NS)
    rs = k.create(r.REPLICASETS, burst_sender.replicaset_of(dep, "b0b0", 0), NS)
    # The Deployment's controller is off in this cluster (--no-controllers): the benchmark is the only creator.
    k.patch(r.DEPLOYMENTS, "burst", {"spec": {"replicas": n}}, NS)
    k.patch(r.REPLICASETS, rs["metadata"]["name"], {"spec": {"replicas": n}}, NS)
    # Several client processes (a Python client alone cannot open 400 TLS connections at once),
    # all released at the same instant.
    procs = min(4, n)
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs, initializer=_burst_ready) as pool:
        pool.map(time.sleep, [0.5] * procs)  # every client process started and imported
        at = time.time() + 1.0
        jobs = [
            {"kubeconfig": kubeconfig, "url": url, "ca": ca, "rs": rs, "n": share, "timeout": timeout, "at": at}
            for share in shares
        ]
        parts = pool.map(_burst_part, jobs)
    calls = [c for part in parts for c in part]
    latencies = [c.latency_ms for c in calls]
    errors = [c.problem.split(":", 1)[0] for c in calls if c.problem]
    spans = [(c.sent, c.answered) for c in calls if c.answered is not None]
    took = max(end for _, end in spans) - min(sent for sent, _ in spans) if spans else float("inf")
    pods = k.list(r.PODS, NS, label_selector="app=burst")
    on_demand = sum(1 for p in pods if p["metadata"]["labels"].get("spotguard.io/placement") == "on-demand")
    kinds: dict[str, int] = {}
    for e in errors:
        kinds[e] = kinds.get(e, 0) + 1
    return {
        "burst_reviews": n,
        "burst_errors": len(errors),
        "burst_error_kinds": kinds,
        "burst_p50_ms": round(statistics.median(latencies), 1),
        "burst_p99_ms": round(percentile(latencies, 99), 1),
        "burst_throughput_rps": round(len(spans) / took, 1),  # answers per second while the burst lasted
        "burst_on_demand": on_demand,
        "burst_floor": -(-n // 10),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class _SkipToBurst(Exception):
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="latency samples per endpoint")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput run length")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients for throughput")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn threads per worker")
    parser.add_argument("--burst", type=int, default=400, help="reviews in flight at once (0: skip the burst)")
    parser.add_argument("--only-burst", action="store_true", help="run the burst alone")
    args = parser.parse_args()
    # The folder holds the webhook's private key: removed however the run ends.
    with tempfile.TemporaryDirectory(prefix="spotguard-bench-") as folder:
        return run(args, Path(folder))


def run(args: argparse.Namespace, workdir: Path) -> int:
    tls = certs.make(workdir / "tls", ["localhost"], ips=["127.0.0.1"])
    ca = str(tls.ca_cert)
    results: dict[str, Any] = {}
    # The simulated cluster runs in its own process, so this client does not share a GIL with it.
    sim, kubeconfig = start_sim(workdir)
    k = kube.connect(kubeconfig)
    servers: list[Any] = []
    try:
        if args.only_burst:
            raise _SkipToBurst
        hook, hook_url = start("webhook", tls, kubeconfig, 1, args.threads)
        servers.append(hook)
        noop, noop_url = start("noop", tls, kubeconfig, 1, args.threads)
        servers.append(noop)
        # The shipped webhook configuration, pointed at the local server.
        k.create(
            r.MUTATINGWEBHOOKCONFIGURATIONS,
            registration.webhook_configuration(
                hook_url + "/mutate", base64.b64encode(tls.ca_cert.read_bytes()).decode()
            ),
        )
        # 1. API requests per admitted pod (after a warm-up Deployment).
        k.create(r.DEPLOYMENTS, deployment("warmup", 10), NS)
        wait_pods(k, "warmup", 10)
        before = kube_requests(hook_url, ca)
        k.create(r.DEPLOYMENTS, deployment("web", 100), NS)
        pods = wait_pods(k, "web", 100)
        time.sleep(0.5)
        used = kube_requests(hook_url, ca) - before
        on_demand = sum(1 for p in pods if p["metadata"]["labels"]["spotguard.io/placement"] == "on-demand")
        results["api_requests_per_pod"] = round(used / 100, 3)
        results["api_requests_100_pods"] = int(used)
        results["on_demand_of_100"] = on_demand

        # 2. Latency, webhook vs no-op, interleaved blocks on kept-alive connections.
        rs = next(x for x in k.list(r.REPLICASETS, NS) if x["metadata"]["name"].startswith("web-"))
        body = review_body(rs)
        sessions = {}
        for name in ("webhook", "noop"):
            s = requests.Session()
            s.verify = ca
            sessions[name] = s
        urls = {"webhook": hook_url, "noop": noop_url}
        samples: dict[str, list[float]] = {"webhook": [], "noop": []}
        for name in samples:
            timed_posts(sessions[name], urls[name], body, 100)  # warm
        block = 100
        for _ in range(max(1, args.requests // block)):
            for name in samples:
                samples[name] += timed_posts(sessions[name], urls[name], body, block)
        results["p50_ms"] = round(statistics.median(samples["webhook"]), 3)
        results["p99_ms"] = round(percentile(samples["webhook"], 99), 3)
        results["noop_p50_ms"] = round(statistics.median(samples["noop"]), 3)
        results["noop_p99_ms"] = round(percentile(samples["noop"], 99), 3)
        results["p99_ratio"] = round(results["p99_ms"] / results["noop_p99_ms"], 3)

        # 3. Throughput with concurrent clients.
        stop = time.monotonic() + args.seconds
        counts = [0] * args.clients

        def client(i: int) -> None:
            s = requests.Session()
            s.verify = ca
            while time.monotonic() < stop:
                timed_posts(s, hook_url, body, 1)
                counts[i] += 1

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
        results["throughput_rps"] = round(sum(counts) / (time.monotonic() - started), 1)
        results["latency_samples"] = len(samples["webhook"])
    except _SkipToBurst:
        pass
    finally:
        for p in servers:
            p.terminate()
            p.join(10)
        sim.terminate()
        sim.wait(10)
    if args.burst:
        # 4. A burst against a server with its default sizing, on a cluster without controllers.
        sim, kubeconfig = start_sim(workdir / "burst", no_controllers=True)
        k = kube.connect(kubeconfig)
        try:
            hook, hook_url = start("webhook", tls, kubeconfig, None, None)
            servers = [hook]
            timeout = float(registration.webhook_configuration("", "")["webhooks"][0]["timeoutSeconds"])
            results.update(burst(k, kubeconfig, hook_url, ca=ca, n=args.burst, timeout=timeout))
        finally:
            for p in servers:
                p.terminate()
                p.join(10)
            sim.terminate()
            sim.wait(10)
    results["load_average"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
