"""Serve the node-added function: CloudEvents over HTTP, and a reconcile on a timer.

POST / takes CloudEvents in binary or structured mode (a Node added, a ping);
GET /healthz (the process), GET /readyz (whether passes can run: the cluster
reached, the last passes not all failed) and GET /metrics answer. With --reconcile-interval S (> 0), a pass
also runs every S seconds: the shape for clusters without Knative or Lambda.
SIGTERM and SIGINT stop it cleanly: a pass in progress finishes first.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading

from spotguard import flags, logs, serving
from spotguard.nodeadded import service, triggers

log = logging.getLogger("spotguard.nodeadded")

DEFAULT_PORT = 8080


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT}; 0: none)")
    flags.add_host(parser)
    flags.add_kubeconfig(parser)
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=0.0,
        help="seconds between scheduled passes (default 0: only when an event asks)",
    )


def build_service(kubeconfig: str | None) -> service.Service:
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise logs.UserError(f"--kubeconfig {kubeconfig}: no such file")
    from spotguard.nodeadded.reconciler import Reconciler

    try:
        rec = Reconciler.from_environment(kubeconfig)
    except Exception as exc:
        raise logs.UserError(f"cannot connect to the cluster: {exc}") from exc
    return service.Service(lambda: rec)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port < 65536:
        raise logs.UserError(f"--port must be 0 to 65535, not {args.port}")
    if args.reconcile_interval < 0:
        raise logs.UserError("--reconcile-interval must not be negative")
    if not args.port and not args.reconcile_interval:
        raise logs.UserError("nothing to do: give --port, --reconcile-interval, or both")
    svc = build_service(args.kubeconfig)
    stop = threading.Event()
    timer = None
    if args.reconcile_interval > 0:
        timer = threading.Thread(
            target=_every, args=(svc, args.reconcile_interval, stop), name="reconcile", daemon=True
        )
        timer.start()
    try:
        if args.port:
            _serve_http(svc, args.host, args.port)
        else:
            serving.wait_for_signal(stop)
    finally:
        stop.set()
        if timer is not None:
            timer.join()
    log.info("stopped")
    return 0


def _every(svc: service.Service, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
            svc.handle(triggers.Trigger(triggers.Kind.SCHEDULE, detail="timer"))
        except service.Transient as exc:
            log.warning("scheduled pass failed; next interval tries again", extra={"error": str(exc)})


def _serve_http(svc: service.Service, host: str, port: int) -> None:
    from spotguard.nodeadded import app

    serving.serve(app.create_app(svc), host, port, max_body=app.MAX_BODY, graceful_timeout=60.0)
