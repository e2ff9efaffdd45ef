"""Serve the spot-interruption function: CloudEvents over HTTP (--port) and/or an SQS poller (--sqs-queue-url).

With --port, POST / takes CloudEvents in binary or structured mode, and GET /healthz
(the process), GET /readyz (whether it can do its job: the cluster reached, its
last handlings and reconciles not all failed) and GET /metrics answer. With
--sqs-queue-url, the queue the EventBridge rules feed is long-polled. Both may
run in one process; without either, it serves HTTP on port 8080. A reconcile
every --reconcile-interval seconds scales surges back.
SIGTERM and SIGINT stop it cleanly: requests and handlings in progress finish first.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from spotguard import flags, logs, readiness, serving
from spotguard.interruption import dispatch

if TYPE_CHECKING:
    from spotguard.interruption import handler as handler_mod

log = logging.getLogger("spotguard.interruption")

DEFAULT_PORT = 8080


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, help=f"serve CloudEvents over HTTP on this port (default {DEFAULT_PORT})")
    flags.add_host(parser)
    flags.add_kubeconfig(parser)
    parser.add_argument("--sqs-queue-url", help="long-poll this SQS queue for EventBridge events")
    parser.add_argument("--region", help="AWS region (default: $AWS_REGION or $AWS_DEFAULT_REGION)")
    parser.add_argument(
        "--endpoint-url", help="AWS endpoint for SQS and EC2 (a local emulator such as moto or LocalStack)"
    )
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=15.0,
        help="seconds between reconciles that scale surges back (default 15; 0: never)",
    )
    parser.add_argument("--wait-seconds", type=int, default=20, help="SQS long-poll wait, 0 to 20 seconds (default 20)")
    parser.add_argument(
        "--visibility-timeout",
        type=int,
        help="seconds a received message stays invisible, extended while it is handled (default: the queue's)",
    )


def run(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise logs.UserError(f"--port must be 1 to 65535, not {args.port}")
    if not 0 <= args.wait_seconds <= 20:
        raise logs.UserError(f"--wait-seconds must be 0 to 20, not {args.wait_seconds}")
    if args.reconcile_interval < 0:
        raise logs.UserError("--reconcile-interval must not be negative")
    port = args.port if args.port is not None or args.sqs_queue_url else DEFAULT_PORT
    region = args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if args.sqs_queue_url and not region:
        raise logs.UserError("--sqs-queue-url needs an AWS region: --region, $AWS_REGION or $AWS_DEFAULT_REGION")

    served = build_handler(args.kubeconfig, region, args.endpoint_url)
    handler = dispatch.Serialized(served, readiness.Readiness(readiness.cluster_probe(served.kube)))
    stop = threading.Event()
    threads: list[threading.Thread] = []
    poller = None
    if args.sqs_queue_url:
        import boto3

        from spotguard.interruption.poller import Poller

        client = boto3.client("sqs", region_name=region, endpoint_url=args.endpoint_url)
        poller = Poller(
            client,
            args.sqs_queue_url,
            handler,
            wait_seconds=args.wait_seconds,
            visibility_timeout=args.visibility_timeout,
        )
        threads.append(threading.Thread(target=poller.run, name="sqs-poller", daemon=True))
    if args.reconcile_interval > 0:
        threads.append(
            threading.Thread(
                target=_reconcile_every, args=(handler, args.reconcile_interval, stop), name="reconcile", daemon=True
            )
        )
    for thread in threads:
        thread.start()
    try:
        if port:
            _serve_http(handler, args.host, port, stop)
        else:
            serving.wait_for_signal(stop)
    finally:
        stop.set()
        if poller is not None:
            poller.stop()
        for thread in threads:
            thread.join()
    log.info("stopped")
    return 0


def build_handler(kubeconfig: str | None, region: str | None, endpoint_url: str | None) -> handler_mod.Handler:
    """The handler for a cluster: its connection, its settings and the AWS clients when a region is known."""
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise logs.UserError(f"--kubeconfig {kubeconfig}: no such file")
    from spotguard.gateway import kube, settings
    from spotguard.interruption import handler

    try:
        k = kube.connect(kubeconfig)
    except Exception as exc:
        raise logs.UserError(f"cannot connect to the cluster: {exc}") from exc
    settings.load(k)  # read once now: problems are logged at start

    def current() -> Any:
        return settings.load(k)[0]  # re-read at the settings' TTL

    return handler.Handler.for_region(k, current, region, endpoint_url)


def _reconcile_every(handler: dispatch.Handler, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        dispatch.reconcile(handler, transport="schedule")


def _serve_http(handler: dispatch.Handler, host: str, port: int, stop: threading.Event) -> None:
    from spotguard.interruption import app

    serving.serve(app.create_app(handler), host, port, max_body=app.MAX_BODY, graceful_timeout=30.0)
