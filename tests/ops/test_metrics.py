"""Metrics as Prometheus's naming conventions ask (https://prometheus.io/docs/practices/naming/).

A component prefix on every name, one name for one thing, label values from a
fixed set (never a sentence), and no ``pid`` label when the webhook's workers'
metrics are served summed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import prometheus_client
import requests
from spotguard import certs
from spotguard.admission import metrics as admission_metrics
from spotguard.gateway import stats  # noqa: F401  (registers spotguard_kube_*)
from spotguard.interruption import metrics as interruption_metrics  # noqa: F401
from spotguard.interruption import telemetry  # noqa: F401
from spotguard.nodeadded import metrics as nodeadded_metrics  # noqa: F401
from spotguard_sim import testing

from tests.admission.servers import free_port
from tests.ops.support import SCENARIOS

COMPONENTS = ("admission", "interruption", "nodeadded", "kube")


def _ours() -> dict[str, prometheus_client.Metric]:
    return {m.name: m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("spotguard_")}


def test_every_name_has_its_component_and_one_thing_has_one_name() -> None:
    names = _ours()
    assert len(names) > 30
    for name in names:
        assert name.split("_")[1] in COMPONENTS, name
    # Kubernetes API calls are counted once, by the gateway, for every function
    assert "spotguard_kube_requests" in names
    assert not [n for n in names if n.startswith("spotguard_admission_api_calls")]
    assert "spotguard_admission_no_spot_nodes" not in names  # a condition like the others
    # readiness is a number, why is a condition from a fixed set (not a sentence in a label)
    assert names["spotguard_admission_ready"].type == "gauge"
    assert not admission_metrics.READY._labelnames
    assert admission_metrics.CONDITION._labelnames == ("condition",)


def test_the_summed_workers_metrics_have_no_pid_and_no_free_text(tmp_path: Path) -> None:
    # GIVEN the webhook with two workers, their metrics summed on --metrics-port, against a cluster
    # without an on-demand node (a condition it reports and stays ready through)
    scenario = tmp_path / "spot-only.yaml"
    scenario.write_text(re.sub(r"capacity: on-demand", "capacity: spot", (SCENARIOS / "small.yaml").read_text()))
    paths = certs.make(tmp_path / "certs", ["localhost"], ["127.0.0.1"])
    port, metrics_port = free_port(), free_port()
    with testing.running_cluster(scenario, time_scale=10) as sim:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("SPOTGUARD_")}
        env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))
        log = (tmp_path / "admission.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotguard.cli", "serve", "admission", "--port", str(port),
             "--metrics-port", str(metrics_port), "--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
             "--kubeconfig", sim.kubeconfig, "--workers", "2"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            text = ""
            deadline = time.monotonic() + 60
            while 'spotguard_admission_cluster_condition{condition="no_on_demand_nodes"} 1.0' not in text:
                assert proc.poll() is None, (tmp_path / "admission.log").read_text()[-3000:]
                assert time.monotonic() < deadline, text[-3000:] or (tmp_path / "admission.log").read_text()[-3000:]
                try:
                    ready = requests.get(f"https://127.0.0.1:{port}/readyz", verify=str(paths.ca_cert), timeout=5)
                    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
                except requests.RequestException:
                    pass
                time.sleep(0.3)
            # THEN the webhook stays ready (a condition of the whole cluster), and says why in its body
            assert ready.status_code == 200 and "no node matches the on-demand requirement" in ready.text
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # AND no series carries a pid, readiness is one number, conditions are from the fixed set
    assert 'pid="' not in text, [line for line in text.splitlines() if 'pid="' in line][:5]
    assert re.search(r"^spotguard_admission_ready 1\.0$", text, re.M), text
    conditions = set(re.findall(r'^spotguard_admission_cluster_condition\{condition="([^"]+)"\}', text, re.M))
    assert conditions == set(admission_metrics.CONDITIONS)
    assert "spotguard_admission_api_calls" not in text
