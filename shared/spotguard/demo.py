"""Reclaim every spot node at once and watch spotguard keep every workload serving.

The demo runs on the built-in simulated cluster, with the real parts around it:
the admission webhook served by gunicorn over HTTPS (a separate process,
registered with the cluster as ``infra/kubernetes/base/webhook.yaml`` says) places
every pod, and the spot-interruption handler answers EC2 interruption notices
for all spot nodes at once. The simulated cloud reclaims the nodes two minutes
later; pods take ``--ready-delay`` seconds to start. A time scale makes the
minutes pass in seconds. At the end it prints, per workload, its floor and the
fewest serving replicas it ever had (Ready pods on nodes whose instance still
runs: the API keeps a dead node's pods Ready for tens of seconds, as a real
cluster does), and exits non-zero if any workload fell below its floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotguard import certs
from spotguard.admission import registration
from spotguard.logs import UserError
from spotguard.policy import config as config_mod
from spotguard.policy import floors
from spotguard.policy.notices import Notice, NoticeKind
from spotguard.policy.views import NodeView
from spotguard.policy.workloads import PLACEMENT_LABEL, SURGE, Workload
from spotguard.sim import readiness, testing
from spotguard.sim import scenario as scenario_mod
from spotguard.sim import settings as sim_settings

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = ROOT / "infra" / "scenarios" / "small.yaml"
INFRA_KINDS = {"Node", "Namespace"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=str(DEFAULT_SCENARIO), help="Kubernetes YAML: nodes and workloads")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per real second (20)")
    parser.add_argument("--ready-delay", type=float, default=30.0, help="seconds a pod takes to become Ready (30)")
    parser.add_argument("--reclaim-after", type=float, default=120.0, help="seconds from notice to reclaim (120)")
    parser.add_argument(
        "--drainer", action="store_true", help="also drain at the notice, as aws-node-termination-handler does"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line at the end")


def run(args: argparse.Namespace) -> int:
    if args.time_scale <= 0:
        raise UserError("--time-scale must be positive")
    path = Path(args.scenario)
    if not path.is_file():
        raise UserError(f"scenario {path} not found")
    timings, objects = sim_settings.split(scenario_mod.load(path))
    infra = [o for o in objects if o.get("kind") in INFRA_KINDS]
    apps = [o for o in objects if o.get("kind") not in INFRA_KINDS]
    if not any(o.get("kind") in ("Deployment", "StatefulSet") for o in apps):
        raise UserError(f"scenario {path} has no Deployment or StatefulSet")
    out = Printer(args.json)
    if args.log_level is None and "SPOTGUARD_LOG_LEVEL" not in os.environ:
        # The demo prints its own story; the components' logs only when asked for.
        logging.getLogger().setLevel(logging.WARNING)
    with (
        tempfile.TemporaryDirectory(prefix="spotguard-demo-") as tmp,
        testing.running_cluster(
            infra,
            time_scale=args.time_scale,
            ready_delay_seconds=args.ready_delay,
            drainer=args.drainer,
            settings=timings,
        ) as sim,
    ):
        sim.store.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}}])
        out.say(f"simulated cluster at {sim.url} (kubeconfig {sim.kubeconfig}), time x{args.time_scale:g}")
        with admission_server(sim, Path(tmp), time_scale=args.time_scale) as url:
            out.say(f"admission webhook (gunicorn, HTTPS) at {url}")
            summary = play(sim, apps, args, out)
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["ok"] else 1


class Printer:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def admission_server(sim: Any, workdir: Path, time_scale: float = 1.0) -> Iterator[str]:
    """``spotguard serve admission`` in a child process, registered as the cluster's webhooks
    (the pod-create webhook and the eviction guard)."""
    paths = certs.make(workdir / "certs", ["localhost"], ["127.0.0.1"])
    port = free_port()
    cmd = [
        sys.executable, "-m", "spotguard.cli", "--log-level", "WARNING", "serve", "admission",
        "--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
        "--kubeconfig", sim.kubeconfig, "--workers", "1",
    ]  # fmt: skip
    log = (workdir / "admission.log").open("w")
    env = dict(os.environ)
    # The child measures the eviction guard's no-notice grace on its own (real) clock.
    env.setdefault("SPOTGUARD_EVICTION_GRACE_SECONDS", f"{8.0 / max(time_scale, 1.0):.3f}")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        context = ssl.create_default_context(cafile=str(paths.ca_cert))
        wait_until(lambda: _healthy(f"https://localhost:{port}/healthz", context, proc), 30, "the webhook to start")
        url = f"https://localhost:{port}/mutate"
        sim.store.apply_objects([
            registration.webhook_configuration(url, paths.ca_bundle),
            registration.eviction_webhook_configuration(f"https://localhost:{port}/evictions", paths.ca_bundle),
        ])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _healthy(url: str, context: ssl.SSLContext, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise UserError(f"the admission server exited with {proc.returncode}")
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait_until(what: Callable[[], bool], timeout: float, message: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(step)
    raise UserError(f"timed out after {timeout:.0f}s waiting for {message}")


def workloads(store: Any) -> dict[str, Workload]:
    out = {}
    for res, kind in (("deployments", "Deployment"), ("statefulsets", "StatefulSet")):
        for obj in store.list(res)[0]:
            obj.setdefault("kind", kind)
            w = Workload.from_json(obj)
            out[w.key] = w
    return out


def placements(store: Any) -> dict[str, dict[str, int]]:
    """key -> {"on-demand": n, "spot": n} by the capacity of the node each Ready pod runs on."""
    cfg = config_mod.Config()
    nodes = {
        n["metadata"]["name"]: cfg.node_capacity(n["metadata"].get("labels") or {}) for n in store.list("nodes")[0]
    }
    out: dict[str, dict[str, int]] = {}
    for pod in store.list("pods")[0]:
        key = readiness.workload_key(pod)
        if key is None or not readiness.is_ready(pod):
            continue
        where = nodes.get(pod["spec"].get("nodeName", ""))
        label = where.value if where else (pod["metadata"].get("labels") or {}).get(PLACEMENT_LABEL, "?")
        counts = out.setdefault(key, {"on-demand": 0, "spot": 0})
        counts[label] = counts.get(label, 0) + 1
    return out


def notices_for(nodes: Sequence[Obj], when: float) -> list[Notice]:
    """One EC2 Spot Instance Interruption Warning for each node, as EventBridge would send it."""
    t = datetime.fromtimestamp(when, UTC)
    out = []
    for n in nodes:
        view = NodeView.from_json(n)
        out.append(
            Notice(
                event_id=f"demo-{view.instance_id}",
                kind=NoticeKind.INTERRUPTION,
                instance_id=view.instance_id,
                time=t,
                action="terminate",
                region="us-east-1",
                account="123456789012",
            )
        )
    return out


def play(sim: Any, apps: list[Obj], args: argparse.Namespace, out: Printer) -> dict[str, Any]:
    from spotguard.gateway import kube
    from spotguard.interruption.handler import Handler, Outcome

    store = sim.store
    scale = args.time_scale
    cfg = config_mod.Config()
    store.apply_objects(apps)
    wait_until(lambda: bool(workloads(store)), 10, "the workloads")
    before = workloads(store)
    floor = {k: floors.floor_for(w, cfg).on_demand for k, w in before.items()}
    total = sum(w.replicas for w in before.values())

    def ready() -> int:
        """Pods that serve (Ready on a node whose instance runs), not the API's Ready alone."""
        return sum(1 for p in store.list("pods")[0] if sim.serving(p))

    wait_until(lambda: ready() >= total, (4 * args.ready_delay) / scale + 30, "every pod to be Ready")
    out.say("")
    out.say("placed by the admission webhook:")
    table(out, before, floor, placements(store))

    spot = [n for n in store.list("nodes")[0] if cfg.node_capacity(n["metadata"].get("labels") or {}).value == "spot"]
    names = sorted(n["metadata"]["name"] for n in spot)
    tracker = readiness.Tracker()
    tracker.start(store)
    tracker.arm(names)
    handler = Handler(kube.Kube(sim.api_client()), cfg, clock=sim.clock.now)
    t0 = sim.clock.now()
    out.say("")
    out.say(f"t=0s  EC2: every spot node will be reclaimed in {args.reclaim_after:g}s: {', '.join(names)}")
    pending = notices_for(spot, t0)
    for _ in range(20):
        outcomes = handler.handle(pending)
        pending = [n for n, o in zip(pending, outcomes, strict=True) if o is Outcome.RETRY]
        if not pending:
            break
        time.sleep(0.2)
    sim.reclaim(names, after_seconds=args.reclaim_after)
    surged = {k: w for k, w in workloads(store).items() if SURGE in w.annotations}
    out.say(
        f"t={sim.clock.now() - t0:.0f}s  spotguard: tainted {len(names)} nodes, surged "
        + (", ".join(f"{k.split('/', 1)[1]} {before[k].replicas}->{w.replicas}" for k, w in surged.items()) or "none")
    )

    last_print = -1e9

    def settled() -> bool:
        nonlocal last_print
        handler.reconcile()
        now = sim.clock.now() - t0
        left = [n for n in names if _in_service(sim, n)]
        current = workloads(store)
        in_surge = [k for k, w in current.items() if _surging(w.annotations.get(SURGE))]
        if now - last_print >= 20:
            last_print = now
            counts = tracker.counts()
            worst = min((counts.get(k, 0) - floor[k] for k in before), default=0)
            out.say(
                f"t={now:.0f}s  spot nodes left {len(left)}, surges in progress {len(in_surge)}, "
                f"Ready pods {sum(counts.values())}, closest to a floor: {worst:+d}"
            )
        return (
            not left
            and not in_surge
            and all(current[k].replicas == before[k].replicas for k in before if k in current)
            and ready() >= total
        )

    wait_until(settled, (args.reclaim_after + 6 * args.ready_delay) / scale + 60, "the surge to end", step=0.25)
    out.say(f"t={sim.clock.now() - t0:.0f}s  every spot node is gone or down; every workload is back at its replicas")
    out.say("")
    out.say("after the reclaim:")
    table(out, before, floor, placements(store), tracker.lowest)
    below = sorted(k for k in before if tracker.lowest.get(k, 0) < max(floor[k], 1))
    out.say("")
    out.say("no workload fell below its floor" if not below else f"below their floor: {', '.join(below)}")
    return {
        "ok": not below,
        "spot_nodes_reclaimed": len(names),
        "workloads": len(before),
        "surged": sorted(surged),
        "lowest_ready": {k: tracker.lowest.get(k, 0) for k in sorted(before)},
        "floors": {k: floor[k] for k in sorted(before)},
        "below_floor": below,
        "drainer": bool(args.drainer),
    }


def _in_service(sim: Any, name: str) -> bool:
    """The node is still in the API and not yet known there as lost: a terminated node is deleted
    about a minute after its instance (docs/sim.md); a stopped or hibernated one stays, Unknown."""
    if not _exists(sim.store, name):
        return False
    node = sim.store.get("nodes", name)
    ready = [c.get("status") for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return sim.cloud.running(name) or ready == ["True"]


def _surging(record: str | None) -> bool:
    """A surge record still in progress (a finished one stays while a doomed node is in the API)."""
    if not record:
        return False
    try:
        return not json.loads(record).get("done")
    except (ValueError, AttributeError):
        return True


def _exists(store: Any, name: str) -> bool:
    try:
        store.get("nodes", name)
    except Exception:
        return False
    return True


def table(
    out: Printer,
    wls: dict[str, Workload],
    floor: dict[str, int],
    where: dict[str, dict[str, int]],
    lowest: dict[str, int] | None = None,
) -> None:
    head = f"  {'workload':34} {'replicas':>8} {'floor':>5} {'on-demand':>9} {'spot':>5}"
    out.say(head + ("  lowest Ready" if lowest is not None else ""))
    for key in sorted(wls):
        c = where.get(key, {})
        line = f"  {key:34} {wls[key].replicas:>8} {floor[key]:>5} {c.get('on-demand', 0):>9} {c.get('spot', 0):>5}"
        if lowest is not None:
            line += f"  {lowest.get(key, 0):>12}"
        out.say(line)
