"""How often the default demo keeps its promise with a drainer at the notice, over seeds.

Each run is ``spotguard demo --drainer --seed N`` (the provisioned demo scenario,
Karpenter launching every node, x20, a drainer that cordons and evicts 0-2 s after the
notice, seeded by N) through :func:`spotguard.ops.cycle.run`, one after another. For each
seed: whether the promise held (no Deployment served fewer replicas than just before the
notice, no StatefulSet fell below its floor), the workloads that broke it, whether the
return to spot finished, the simulated length of the cycle and the real seconds it took.
The break rate is the figure issue 23 asks for beside "held in N of N runs".

Prints ONE JSON line::

    .venv/bin/python bench/demo_drainer.py [--seeds 10] [--first 1] [--scenario FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from spotguard.ops import cycle, report  # noqa: E402
from spotguard_sim import scenario as scenario_mod  # noqa: E402

DEFAULT = ROOT / "infra" / "scenarios" / "demo-karpenter.yaml"


def one(objects: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        out = cycle.run(cycle.Options(objects=objects, drainer=True, seed=seed))
    broken = [f"{r.kind}/{r.namespace}/{r.name} {r.ready_before} -> {r.min_ready}"
              for r in report.rows(out) if r.lost_service]
    return {
        "seed": seed,
        "held": not broken,
        "broken": broken,
        "returned": out.returned,
        "cycle_seconds": round(out.duration, 1),
        "real_seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds (runs)")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--scenario", default=str(DEFAULT))
    args = parser.parse_args(argv)
    objects = scenario_mod.load(args.scenario)
    runs = [one(objects, seed) for seed in range(args.first, args.first + args.seeds)]
    held = sum(1 for r in runs if r["held"])
    real = sorted(r["real_seconds"] for r in runs)
    print(json.dumps({
        "scenario": str(Path(args.scenario).relative_to(ROOT)) if Path(args.scenario).is_relative_to(ROOT)
        else args.scenario,
        "runs": len(runs),
        "held": held,
        "break_rate": round(1 - held / len(runs), 3) if runs else None,
        "returned": sum(1 for r in runs if r["returned"] == "done"),
        "real_seconds_median": real[len(real) // 2] if real else None,
        "real_seconds_max": real[-1] if real else None,
        "per_seed": runs,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
