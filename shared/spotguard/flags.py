"""Flags several commands share: one default and one help text for each, wherever it is taken.

* ``--host``: the address a server binds, 127.0.0.1 for every ``spotguard serve``
  function (a function run on a laptop is not reachable from the network; the
  manifests pass ``--host=0.0.0.0`` in a container).
* ``--kubeconfig``: the cluster; without it, what kubectl and the Kubernetes
  clients read (in a pod its service account, else ``$KUBECONFIG``, else
  ``~/.kube/config``: :mod:`spotguard.gateway.connection`).
* ``--log-level``: one of :data:`spotguard.logs.LEVELS`; anything else is refused.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
KUBECONFIG_HELP = "kubeconfig file (default: in a pod its service account, else $KUBECONFIG, else ~/.kube/config)"


def add_host(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}; --host=0.0.0.0 in a container)",
    )  # fmt: skip


def add_kubeconfig(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup, help: str = "") -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", help=help or KUBECONFIG_HELP)


def log_level(value: str) -> str:
    """``--log-level``'s type: a level name (any case), or argparse's usage error (exit 2)."""
    from spotguard import logs

    try:
        return logs.level_of(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def env_kubeconfig(env: Mapping[str, str] | None = None) -> str | None:
    """The kubeconfig ``$KUBECONFIG`` names (the first file of its list that exists), or None when unset.

    A ``$KUBECONFIG`` that names no existing file is returned as it is (the caller says "no such file")."""
    env = os.environ if env is None else env
    paths = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p]
    for p in paths:
        if Path(p).expanduser().is_file():
            return str(Path(p).expanduser())
    return paths[0] if paths else None
