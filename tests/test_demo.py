"""The demo, run as a user runs it: every spot node reclaimed, no workload below its floor."""

from __future__ import annotations

import json
import subprocess
import sys


def run_demo(*extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "demo", "--json", "--time-scale", "30", *extra],
        capture_output=True,
        check=False,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_demo_keeps_every_workload_at_its_floor() -> None:
    summary = run_demo()
    assert summary["ok"] is True
    assert summary["below_floor"] == []
    assert summary["spot_nodes_reclaimed"] == 4
    assert summary["surged"], "the demo scenario has Deployments on spot: they must surge"
    for key, floor in summary["floors"].items():
        assert summary["lowest_ready"][key] >= max(floor, 1), key


def test_demo_with_a_drainer_at_the_notice() -> None:
    summary = run_demo("--drainer")
    assert summary["ok"] is True and summary["drainer"] is True


def test_demo_rejects_a_missing_scenario(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "demo", "--scenario", str(tmp_path / "nope.yaml")],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "not found" in proc.stderr
