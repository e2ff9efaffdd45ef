"""The demo, run as a user runs it: the full cycle judged by serving replicas, bad arguments, interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from spotguard_sim import catalogue

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "infra" / "scenarios" / "demo.yaml"
SPOTGUARD = [sys.executable, "-m", "spotguard.cli"]


def run_demo(*extra: str, expect: int | None = 0, scale: str = "30") -> tuple[dict, subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        [*SPOTGUARD, "demo", "--json", "--time-scale", scale, *extra],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    if expect is not None:
        assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def test_demo_keeps_the_promise_without_a_drainer(tmp_path: Path) -> None:
    # GIVEN the fixed-node scenario (six workloads) WHEN every spot node is reclaimed at once
    # (at the default 20x: spotguard's real-time latency on a loaded machine is simulated time too)
    summary, proc = run_demo("--scenario", str(DEMO), "--plot", str(tmp_path / "serving.png"), scale="20")
    # THEN the promise held, judged per workload by serving replicas
    assert summary["interruption_free"] is True
    rows = {(w["kind"], w["namespace"], w["name"]): w for w in summary["workloads"]}
    assert len(rows) >= 5
    kinds = {(w["kind"], w["desired"] > 1) for w in rows.values()}
    assert {("Deployment", True), ("Deployment", False), ("StatefulSet", True), ("StatefulSet", False)} <= kinds
    for w in rows.values():
        required = w["ready_before"] if w["kind"] == "Deployment" else w["floor"]
        assert w["min_ready"] >= required and w["lost_service"] is False, w
        assert w["ready_before"] == w["desired"], w
    # AND the web Deployment (3 of 4 on spot) never served fewer than 4, though all its spot pods went
    web = rows[("Deployment", "shop", "web")]
    assert web["min_ready"] == 4 and web["spot_share_before"] == 0.75
    # AND each phase's speed and the simulated scheduler's lag since the notice are reported
    assert summary["time_scales"]["placing"] == 20 and set(summary["time_scales"]) <= {"placing", "notice", "return"}
    lag = summary["scheduler_lag"]
    assert lag["pods"] > 0 and 0 <= lag["p99_seconds"] <= lag["max_seconds"], lag
    # AND every spot node went, the shares are fractions and the cheapest split is reported
    assert summary["spot_nodes_reclaimed"] == 4
    assert 0 < summary["spot_share_before"] <= summary["optimal_spot_share"] <= 1
    assert summary["spot_share_during"] < summary["spot_share_before"]
    assert 0 < summary["cost_vs_on_demand"] <= 1.2
    # AND money: the scenario's nodes at the catalogue's prices at the notice, the cycle's bill in USD
    nodes = [o for o in yaml.safe_load_all(DEMO.read_text()) if o and o.get("kind") == "Node"]
    hourly = sum(catalogue.Prices().hourly(n["metadata"]["labels"]["node.kubernetes.io/instance-type"],
                                           n["metadata"]["labels"]["karpenter.sh/capacity-type"]) or 0.0
                 for n in nodes)
    assert summary["money"]["before_per_hour"] == pytest.approx(hourly, abs=1e-3)
    assert 0 < summary["money"]["cycle"]["usd"] < summary["money"]["same_nodes_on_demand"]["usd"]
    assert "cluster cost $" in proc.stderr
    # AND the plot is a PNG, and the human output went to stderr
    assert (tmp_path / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "deploy/shop/web" in proc.stderr and "the promise held" in proc.stderr
    # AND new spot nodes joined and node-added moved the workloads back to spot
    assert summary["return_to_spot"] == "done", summary["notes"]
    assert summary["spot_share_after"] > summary["spot_share_during"]
    assert summary["spot_share_after"] >= summary["optimal_spot_share"] - 0.1


def test_demo_with_a_drainer_is_reproducible_and_honest() -> None:
    # GIVEN a drainer that evicts 0-2 s after the notice, seeded
    first, proc = run_demo("--scenario", str(DEMO), "--drainer", "--seed", "3", "--no-return", expect=None)
    # THEN the exit code says whether the promise held, and the JSON says for whom
    broken = [w for w in first["workloads"] if w["lost_service"]]
    assert proc.returncode == (1 if broken else 0), proc.stderr[-2000:]
    assert first["interruption_free"] is (not broken)
    for w in broken:
        required = w["ready_before"] if w["kind"] == "Deployment" else w["floor"]
        assert w["min_ready"] < required
    # AND the drainer's delays are within 0-2 s and the same for the same seed
    delays = first["drainer_delays"]
    assert len(delays) == 4 and all(0 <= d <= 2 for d in delays.values())
    # (another reclaim time, so the delays depend on the seed alone: 90 s, past the 30 s grace of
    # the pods the drainer evicts; at 30 s the kubelet dies with db's evicted pod still
    # terminating, and the demo waits for pod GC to free its ordinal, minutes on a loaded machine)
    again, _ = run_demo(
        "--scenario", str(DEMO), "--drainer", "--seed", "3", "--no-return", "--reclaim-after", "90", expect=None
    )
    assert again["drainer_delays"] == delays


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "/nonexistent/nope.yaml"], "not found"),
        (["--time-scale", "0"], "--time-scale"),
        (["--pod-startup", "-1"], "negative"),
        (["--plot", "out.jpg"], "PNG"),
        (["--plot", "/nonexistent/dir/out.png"], "does not exist"),
        (["--pace", "fast"], "invalid choice"),
        (["--scenario", str(DEMO), "--baselines"], "no Karpenter NodePool"),
        (["--rebalance-lead", "-1"], "give 0 to 3600 seconds"),
        (["--rebalance-action", "drain"], "invalid choice"),
    ],
)
def test_demo_bad_arguments_are_plain_sentences(args: list[str], message: str) -> None:
    proc = subprocess.run([*SPOTGUARD, "demo", *args], capture_output=True, check=False, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not proc.stderr.lstrip().startswith("{") and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [unclosed", "not valid YAML"),
        ("apiVersion: v1\nkind: Node\nmetadata: {name: a}\n", "no Deployment or StatefulSet"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a, namespace: x}\nspec: {replicas: 1}\n",
            "no spot node",
        ),
    ],
)
def test_demo_bad_scenario_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    proc = subprocess.run(
        [*SPOTGUARD, "demo", "--scenario", str(path)], capture_output=True, check=False, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_interrupted_stops_the_webhook_and_removes_its_keys(sig: signal.Signals) -> None:
    # GIVEN a demo in its own temp folder, once its webhook server runs
    tmp = Path(tempfile.mkdtemp(prefix="demo-test-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    # SIGINT as a terminal has it: a shell without job control starts background jobs with
    # SIGINT ignored, and the demo (as any program) keeps that (a full run started with `&`
    # failed here three times: the demo went on with its cycle)
    as_in_a_terminal = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['spotguard', 'demo', '--time-scale', '5']; runpy.run_module('spotguard.cli', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", as_in_a_terminal], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        children: set[int] = set()
        while time.monotonic() < deadline and not (children and list(tmp.glob("spotguard-*/certs/tls.key"))):
            children = _children(proc.pid)
            time.sleep(0.2)
        assert children and list(tmp.glob("spotguard-*/certs/tls.key")), "the webhook never started"
        # WHEN it is interrupted
        proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # what every thread was doing
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            proc.kill()
            out, _ = proc.communicate(timeout=30)
            raise AssertionError("the demo did not exit within 60 s of the signal:\n" + out.decode()[-12000:]) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    # THEN it exits 130, its child processes are gone and no private key is left behind
    assert proc.returncode == 130, out.decode()[-2000:]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.2)
    assert not any(_alive(c) for c in children)
    assert not list(tmp.rglob("*.key")), sorted(tmp.rglob("*"))


@pytest.mark.parametrize("name", ["", "demo-cluster-autoscaler.yaml"], ids=["default-karpenter", "cluster-autoscaler"])
def test_demo_runs_on_launched_capacity_and_bills_it(name: str) -> None:
    # GIVEN the demo's workloads on a provisioned cluster: the default demo (Karpenter), or
    # Cluster Autoscaler node groups
    summary, proc = run_demo(*(("--scenario", str(ROOT / "infra" / "scenarios" / name)) if name else ()), expect=None)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    if not name:
        # THEN on the default demo the promise held (issue 23: the surges wait for launched
        # on-demand nodes; consolidation after them is surged first; cache, all floor, is kept
        # from consolidation), and a spot node was there to reclaim
        assert summary["interruption_free"] is True and proc.returncode == 0, (
            [w for w in summary["workloads"] if w["lost_service"]],
            proc.stderr[-6000:],
        )
        assert summary["spot_nodes_reclaimed"] >= 1
    # AND spot capacity was launched for the pods that prefer it
    assert summary["spot_nodes_before"] >= 1
    money = summary["money"]
    assert money["before_per_hour"] > 0
    if summary["spot_nodes_reclaimed"] == 0:
        # (a race of launch times: the scheduler binds the pods that prefer spot to the on-demand
        # nodes' room when those are Ready first, and Karpenter removes the empty spot node) the
        # demo says why nothing was reclaimed, and the bill is on-demand alone
        assert any("no spot node ran at the notice" in n and "were gone by then" in n for n in summary["notes"])
        assert summary["spot_share_before"] == 0
        assert set(money["during"]["usd_by_capacity"]) == {"on-demand"}
    else:
        # AND it went at the notice, and the bill counts launched instances, spot and on-demand, in USD
        assert summary["spot_share_before"] > 0
        assert set(money["during"]["usd_by_capacity"]) == {"spot", "on-demand"}
    assert set(money["cycle"]["usd_by_capacity"]) == {"spot", "on-demand"}
    assert money["cycle"]["usd"] < money["same_nodes_on_demand"]["usd"]
    # AND the return to spot brought replicas back onto launched spot capacity (the demo once
    # declared the return over before node-added's first moves: 0 on spot after, on Karpenter)
    if not (summary["return_to_spot"] == "done" and summary["spot_share_after"] > 0):
        # in full (an assertion's tuple is cut short in the report): what held the return
        pytest.fail("\n".join([f"return to spot: {summary['return_to_spot']}, spot share after "
                                f"{summary['spot_share_after']}", *summary["notes"], proc.stderr[-4000:]]))


def test_demo_acts_on_a_rebalance_recommendation_before_the_warning() -> None:
    # GIVEN the Karpenter demo WHEN EC2 recommends a rebalance for the doomed spot node 120 s before
    # its interruption warning, and spotguard surges on a recommendation
    summary, proc = run_demo("--rebalance-lead", "120", "--rebalance-action", "surge", "--no-return",
                             expect=None, scale="20")  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    # AND the bill runs from the recommendation, whatever ran at the notice
    money = summary["money"]
    assert money["cycle"]["seconds"] == pytest.approx(summary["simulated_seconds"] + 120, abs=1)
    if summary["spot_nodes_reclaimed"] == 0:
        # (a launch-time race: the pods that prefer spot took the on-demand nodes' room and
        # Karpenter removed the empty spot node) the demo says why nothing was reclaimed
        assert any("no spot node ran at the notice" in n for n in summary["notes"]), summary["notes"]
        return
    # THEN the promise held, and each Deployment at risk served its count on nodes that stay
    # well before the warning: more than the notice's 120 s before the reclaim (without the
    # recommendation the launch of on-demand capacity leaves thumbnails and web about 50 s)
    assert summary["interruption_free"] is True, proc.stderr[-4000:]
    margins = {w["name"]: w["margin_seconds"] for w in summary["workloads"] if w["margin_seconds"] is not None}
    assert margins and all(m > 120 for m in margins.values()), margins


def test_demo_baselines_show_what_all_on_demand_and_a_drainer_without_spotguard_cost(tmp_path: Path) -> None:
    # GIVEN the Karpenter demo WHEN asked for the baselines too, and a plot
    plot = tmp_path / "cycle.png"
    summary, proc = run_demo("--scenario", str(ROOT / "infra" / "scenarios" / "demo-karpenter.yaml"),
                             "--baselines", "--no-return", "--plot", str(plot), expect=None)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    runs = summary["baselines"]
    # THEN all on-demand launched no spot and lost nothing; spot with a drainer and no spotguard was
    # cheaper and lost serving replicas at the notice
    assert runs["all-on-demand"]["spot_nodes_reclaimed"] == 0
    assert set(runs["all-on-demand"]["money"]["cycle"]["usd_by_capacity"]) == {"on-demand"}
    assert runs["all-on-demand"]["workloads_below_before"] == 0
    assert runs["spot-drainer"]["spot_nodes_reclaimed"] >= 1
    assert runs["spot-drainer"]["money"]["cycle"]["usd"] < runs["all-on-demand"]["money"]["cycle"]["usd"]
    assert runs["spot-drainer"]["workloads_below_before"] >= 1
    # AND every bill covers the same window, and spotguard's saving against all on-demand is reported
    window = summary["money"]["cycle"]["seconds"]
    for run in runs.values():
        assert abs(run["money"]["cycle"]["seconds"] - window) < 15
    assert summary["saving_vs_all_on_demand"] is not None
    assert "baseline spot-drainer" in proc.stderr
    # AND each baseline's serving over the window is in the JSON (from the notice on), and the plot is written
    for run in runs.values():
        assert run["serving_over_time"][0][0] == 0.0 and run["serving_over_time"][0][1] >= 1
    drained = runs["spot-drainer"]["serving_over_time"]
    assert min(n for _, n in drained) < drained[0][1]  # it lost serving replicas, as counted above
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
