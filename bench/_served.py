"""What the benchmarks that serve a loaded simulated cluster share (not a benchmark: run_all skips ``_*``).

- :func:`ready_pod`: a pod bound to a node, Running and Ready (a steady state,
  with the controllers off);
- :func:`load_frozen`: load the objects and keep them out of the cyclic garbage
  collector's way (the simulated API server shares the process);
- :func:`run_child`: run the measured code in a child process (its own core, as
  in its own pod or Lambda) and read the one JSON line it prints;
- :func:`profiled`: call a function, under cProfile (on stderr) when asked.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Obj = dict[str, Any]


def ready_pod(
    name: str,
    namespace: str,
    node: str,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    *,
    spec: Mapping[str, Any] | None = None,
    created: str | None = None,
) -> Obj:
    """A pod of ``owner`` (kind, name, uid) bound to ``node``, Running and Ready."""
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [{"apiVersion": "apps/v1", **owner, "controller": True}],
    }
    if created:
        meta["creationTimestamp"] = created
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {**(spec or {"containers": [{"name": "c", "image": "pause"}]}), "nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        },
    }


def load_frozen(sim: Any, objs: list[Obj]) -> None:
    sim.store.apply_objects(objs)
    # A full collection over 20,000 pods stalls every request of the server in this process.
    gc.collect()
    gc.freeze()


def run_child(script: str, kubeconfig: Any, extra: Sequence[str] = (), *, profile: bool = False) -> Obj | int:
    """Run ``script --child --kubeconfig FILE extra...``; its last stdout line (JSON), or its
    exit code when it failed (its stderr is shown then, and with ``profile``)."""
    command = [sys.executable, script, "--child", "--kubeconfig", str(kubeconfig), *extra]
    proc = subprocess.run(command + (["--profile"] if profile else []), capture_output=True, text=True, check=False)
    if proc.returncode != 0 or profile:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        return proc.returncode
    result: Obj = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def profiled(fn: Callable[..., Any], *args: Any, profile: bool, lines: int = 30) -> Any:
    if not profile:
        return fn(*args)
    import cProfile
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn, *args)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(lines)
    return out
