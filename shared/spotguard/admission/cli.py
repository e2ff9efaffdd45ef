"""Serve the admission webhook over HTTPS (TLS 1.2+) under gunicorn.

``POST /mutate`` answers AdmissionReviews; ``GET /healthz``, ``/readyz`` and
``/metrics`` are for probes and Prometheus. With ``--metrics-port``, ``GET
/metrics`` is also served over plain HTTP on that port, for all workers together.
``--plain-http`` serves the webhook without TLS, for a TLS-terminating proxy in
front (Knative's cluster-local gateway); the API server itself only calls HTTPS. Settings come from SPOTGUARD_*
environment variables; reservation Leases go to $SPOTGUARD_NAMESPACE
(default ``spotguard``).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path

from spotguard import flags
from spotguard.logs import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    flags.add_host(parser)
    parser.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--plain-http", action="store_true", help="no TLS: only behind a proxy that terminates it (Knative)"
    )
    flags.add_kubeconfig(parser)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (default 8)")
    parser.add_argument(
        "--metrics-port", type=int, help="also serve GET /metrics over plain HTTP on this port (every worker's counts)"
    )


def run(args: argparse.Namespace) -> int:
    if args.plain_http and (args.tls_cert or args.tls_key):
        raise UserError("--plain-http takes no --tls-cert or --tls-key")
    if not args.plain_http and not (args.tls_cert and args.tls_key):
        raise UserError("--tls-cert and --tls-key are required (or --plain-http behind a TLS proxy)")
    for label, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path and not Path(path).is_file():
            raise UserError(f"{label} {path}: no such file")
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        raise UserError(f"--kubeconfig {args.kubeconfig}: no such file")
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: not a port")
    if args.workers < 1 or args.threads < 1:
        raise UserError("--workers and --threads must be at least 1")
    if args.metrics_port is not None:
        if not 0 < args.metrics_port < 65536 or args.metrics_port == args.port:
            raise UserError(f"--metrics-port {args.metrics_port}: not a free port")
        _share_metrics()
    from spotguard.admission import connections, core, server

    factory = functools.partial(core.context_from_env, dict(os.environ), args.kubeconfig)
    server.run(
        factory,
        client_timeout=connections.limit_from_env(os.environ),
        host=args.host,
        port=args.port,
        certfile=args.tls_cert,
        keyfile=args.tls_key,
        workers=args.workers,
        threads=args.threads,
        metrics_port=args.metrics_port,
    )
    return 0


def _share_metrics() -> None:
    """prometheus_client's multiprocess mode: workers write their counts under $TMPDIR, the master serves the sum.

    Set before the admission and gateway metrics are created (they are imported
    below, after this), and made the value class of every metric created from now on.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="spotguard-metrics-")
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
