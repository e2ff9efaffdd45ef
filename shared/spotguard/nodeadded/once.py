"""Run one node-added reconcile pass: back to spot, floors repaired, leftovers cleaned.

With --dry-run, the pass reads the cluster and prints its plan (what would
start, what recorded moves would do, what would be cleaned up, and why each
workload off its optimum is left alone), and writes nothing.
"""

from __future__ import annotations

import argparse
import sys

from spotguard import flags, logs
from spotguard.nodeadded import report as report_mod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_kubeconfig(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan; write nothing")


def run(args: argparse.Namespace) -> int:
    from spotguard.gateway.errors import ApiError
    from spotguard.nodeadded import cli

    svc = cli.build_service(args.kubeconfig)
    try:
        rep = svc.reconciler.reconcile(dry_run=args.dry_run, trigger="cli")
    except ApiError as exc:
        raise logs.UserError(f"the pass failed: {exc}") from exc
    sys.stdout.write(report_mod.text(rep))
    return 1 if rep.failures else 0
