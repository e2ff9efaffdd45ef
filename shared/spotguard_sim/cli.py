"""Run the simulated Kubernetes cluster.

    spotguard sim serve --kubeconfig /tmp/sim.kubeconfig --scenario infra/scenarios/small.yaml

serves the Kubernetes API over HTTPS on 127.0.0.1 until interrupted, and writes
a kubeconfig (server URL, CA data, a token) once it is ready; then
``kubectl --kubeconfig /tmp/sim.kubeconfig get nodes``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from spotguard.logs import UserError

log = logging.getLogger("spotguard.sim")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", dest="sim_action")
    serve = sub.add_parser("serve", help="serve the simulated cluster until stopped",
                           description=__doc__)
    serve.add_argument("--kubeconfig", required=True,
                       help="where to write the kubeconfig once the server is ready")
    serve.add_argument("--port", type=int, default=0,
                       help="port on 127.0.0.1 (default: any free port)")
    serve.add_argument("--scenario", help="Kubernetes YAML to load at start (see infra/scenarios)")
    serve.add_argument("--time-scale", type=float, default=1.0,
                       help="simulated seconds per real second (default 1)")
    serve.add_argument("--drainer", action="store_true",
                       help="drain nodes at their reclaim notice, as aws-node-termination-handler")
    serve.add_argument("--ready-delay", type=float, default=0.0,
                       help="simulated seconds before a started pod becomes Ready")
    serve.add_argument("--etcd-compaction-interval", type=float, default=None,
                       help="simulated seconds between etcd compactions (default: the "
                       "scenario's, else 300 as kube-apiserver; 0: never)")
    serve.add_argument("--no-controllers", action="store_true",
                       help="serve the API only (no controllers, scheduler or kubelet)")
    serve.add_argument("--insecure-http", action="store_true",
                       help="serve plain HTTP instead of HTTPS (debugging)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sim_action", None) != "serve":
        raise UserError("usage: spotguard sim serve --kubeconfig PATH [--scenario FILE] ...")
    if args.time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {args.time_scale}")
    if args.ready_delay < 0:
        raise UserError(f"--ready-delay cannot be negative, got {args.ready_delay}")
    if args.scenario and not Path(args.scenario).is_file():
        raise UserError(f"scenario file not found: {args.scenario}")
    compaction = getattr(args, "etcd_compaction_interval", None)
    if compaction is not None and compaction < 0:
        raise UserError(f"--etcd-compaction-interval cannot be negative, got {compaction}")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    from spotguard_sim import cluster, errors

    sim = cluster.SimCluster(args.kubeconfig, time_scale=args.time_scale,
                             tls=not args.insecure_http, port=args.port)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sim.start(scenario=args.scenario, controllers=not args.no_controllers,
                  drainer=args.drainer, ready_delay_seconds=args.ready_delay)
    except errors.StatusError as exc:
        sim.stop()
        raise UserError(f"cannot load the scenario: {exc.message}") from exc
    except OSError as exc:
        sim.stop()
        raise UserError(f"cannot start the simulated cluster: {exc}") from exc
    if compaction is not None:
        sim.store.set_compaction_interval(compaction)
    log.info(
        "simulated cluster serving",
        extra={"url": sim.url, "kubeconfig": str(Path(args.kubeconfig).resolve()),
               "time_scale": args.time_scale, "nodes": sim.store.count("nodes"),
               "pods": sim.store.count("pods")},
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sim.stop()
        log.info("simulated cluster stopped")
    return 0
