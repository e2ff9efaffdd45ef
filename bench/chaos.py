"""The end-to-end chaos figures: every spot node reclaimed at once, with and without API faults.

The chaos suite's bed (tests/chaos/harness.py): the simulated cluster at 20x (4x for the
mixed-faults run, whose hung requests cost real time: harness.DELAY_TIME_SCALE), the
admission webhook over HTTPS, notices through SQS (moto in server mode) to the
spot-interruption poller, the node-added reconcile every minute. For each run:
the lowest serving replicas of every workload against its count just before the
notice (Deployments) or its floor (StatefulSets), and the simulated seconds from
the notice until everything is back (no surge, budget, taint or raised count left;
every workload serving its replicas).

Prints ONE JSON line::

    .venv/bin/python bench/chaos.py [--faults none,mixed]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos import harness  # noqa: E402


def run(moto_url: str, faults: str) -> dict[str, Any]:
    # hung requests cost real time: a run with timeouts goes at x4 (harness.DELAY_TIME_SCALE), as
    # the chaos suite's timeout and mixed columns do (at x20 a run was 20 times harsher than
    # production for every hung request: api's surge Ready 12 s after the reclaim, 2026-11-27)
    scale = harness.DELAY_TIME_SCALE if faults == "mixed" else harness.TIME_SCALE
    with (
        tempfile.TemporaryDirectory(prefix="spotguard-chaos-") as tmp,
        harness.chaos(Path(tmp), moto_url, time_scale=scale) as c,
    ):
        if faults == "mixed":  # 500, 429, 409 and timeouts, 5 % each: 20 % of every API request
            for status in (500, 429, 409):
                c.sim.faults.set(error_rate=0.05, status=status)
            c.sim.faults.set(error_rate=0.05, timeout=True, hold_seconds=1.5)
        started = time.monotonic()
        c.interrupt(c.spot())
        c.settle()
        real = time.monotonic() - started
        figures = c.figures()
    margins = {}
    for key, low in figures["lowest_serving"].items():
        promised = figures["before"][key] if key.startswith("Deployment/") else figures["floors"][key]
        margins[key] = low - promised
    return {
        "faults": faults,
        "time_scale": scale,
        "lowest_serving": figures["lowest_serving"],
        "before": figures["before"],
        "floors": figures["floors"],
        "worst_margin": min(margins.values()),
        # per Deployment that lost pods: seconds before the reclaim its count served elsewhere
        "margin_seconds": figures["margin_seconds"],
        "recovered_after_s": figures["recovered_after_s"],
        "recovered_after_real_s": round(real, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--faults", default="none,mixed", help="runs: none, mixed (20%% API faults)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": harness.REGION,
    }.items():
        os.environ.setdefault(key, value)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        runs = [run(f"http://{host}:{port}", f) for f in args.faults.split(",") if f]
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "benchmark": "chaos",
                "scenario": "every spot node reclaimed at once (6 spot, 3 on-demand, 8 workloads, 33 pods)",
                "time_scale": harness.TIME_SCALE,
                "promise_held": all(r["worst_margin"] >= 0 for r in runs),
                "worst_margin": min(r["worst_margin"] for r in runs),
                "smallest_margin_seconds": min(
                    (m for r in runs for m in r["margin_seconds"].values() if m is not None), default=None
                ),
                "recovered_after_s": max(r["recovered_after_s"] for r in runs),
                "runs": runs,
                "load_average": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
