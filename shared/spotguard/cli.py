"""The ``spotguard`` command line.

Each subcommand lives in its own module that exposes ``add_arguments(parser)``
and ``run(args) -> int``; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from spotguard import __version__, flags

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("spotguard_sim.cli", "run the simulated Kubernetes cluster"),
    "certs": ("spotguard.certs", "write a CA and a serving certificate for the webhook"),
    "demo": ("spotguard.demo", "run the demo on the simulated cluster"),
    "package": ("spotguard.packaging", "build the Lambda zips or stage the Knative function folders"),
    "reconcile": ("spotguard.nodeadded.once", "run one node-added reconcile pass (--dry-run: print the plan)"),
    "replay": ("spotguard.ops.replay", "replay captured events against a cluster, a scenario or a function"),
    "snapshot": ("spotguard.ops.snapshot", "capture a cluster as a scenario for simulate and replay"),
    "simulate": ("spotguard.ops.simulate", "what if these spot nodes went now? (a what-if on a scenario or snapshot)"),
}
# spotguard serve <function>
SERVE: dict[str, tuple[str, str]] = {
    "admission": ("spotguard.admission.cli", "serve the admission webhook over HTTPS"),
    "spot-interruption": ("spotguard.interruption.cli", "serve the spot-interruption function"),
    "node-added": ("spotguard.nodeadded.cli", "serve the node-added function (CloudEvents, a reconcile timer)"),
}


# Left out of the in-cluster image (scripts/install-image): their commands are not offered there.
OPTIONAL = ("spotguard_sim", "spotguard.ops", "spotguard.demo")


def _add(sub: argparse._SubParsersAction, name: str, module: str, help_text: str) -> None:  # type: ignore[type-arg]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith(OPTIONAL):
            return
        raise
    parser = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip())
    mod.add_arguments(parser)
    parser.set_defaults(_run=mod.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotguard",
        description="Keep Kubernetes workloads serving while running as many replicas as possible on spot.",
    )
    parser.add_argument("--version", action="version", version=f"spotguard {__version__}")
    parser.add_argument(
        "--log-level", type=flags.log_level, default=None, metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default $SPOTGUARD_LOG_LEVEL, else INFO)",
    )  # fmt: skip
    parser.add_argument(
        "--log-format", choices=("json", "text"), default=None,
        help="logs as JSON lines for machines or text for a person (default $SPOTGUARD_LOG_FORMAT, else text "
        "when stderr is a terminal and JSON otherwise)",
    )  # fmt: skip
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    serve = sub.add_parser(
        "serve", help="serve one of the functions locally",
        description="Serve one of the functions: the admission webhook over HTTPS, spot-interruption and "
        "node-added over HTTP (CloudEvents). `spotguard serve FUNCTION --help` for each.",
    )  # fmt: skip
    serve_sub = serve.add_subparsers(title="functions", metavar="FUNCTION")
    serve.set_defaults(_run=lambda args: _usage(serve))
    for name, (module, help_text) in SERVE.items():
        _add(serve_sub, name, module, help_text)
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text)
    parser.set_defaults(_run=lambda args: _usage(parser))
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's ``--help`` opens with a description: its one-line help where it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if not child.description and helps.get(name):
                    child.description = str(helps[name])
                _describe(child)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from spotguard import logs

    try:
        logs.configure(args.log_level, args.log_format, strict=True)
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except logs.UserError as exc:
        # A sentence for a person, not a log line for a machine.
        print(f"spotguard: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
