"""Serve the admission webhook over HTTPS (TLS 1.2+) under gunicorn.

``POST /mutate`` answers AdmissionReviews; ``GET /healthz``, ``/readyz`` and
``/metrics`` are for probes and Prometheus. Settings come from SPOTGUARD_*
environment variables; reservation Leases go to $SPOTGUARD_NAMESPACE
(default ``spotguard``).
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from spotguard.logs import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--tls-cert", required=True, metavar="FILE", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", required=True, metavar="FILE", help="its private key (PEM)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (default 8)")


def run(args: argparse.Namespace) -> int:
    for label, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if not Path(path).is_file():
            raise UserError(f"{label} {path}: no such file")
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        raise UserError(f"--kubeconfig {args.kubeconfig}: no such file")
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: not a port")
    if args.workers < 1 or args.threads < 1:
        raise UserError("--workers and --threads must be at least 1")
    from spotguard.admission import core, server

    factory = functools.partial(core.context_from_env, dict(os.environ), args.kubeconfig)
    server.run(
        factory,
        host=args.host,
        port=args.port,
        certfile=args.tls_cert,
        keyfile=args.tls_key,
        workers=args.workers,
        threads=args.threads,
    )
    return 0
