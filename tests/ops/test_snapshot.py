"""`spotguard snapshot`: a cluster captured as a scenario, with nothing secret in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from spotguard_sim import scenario, testing

from tests.ops.support import SCENARIOS, plain_error, spotguard


def _extra() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-password", "namespace": "data"},
         "stringData": {"password": "hunter2"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tool", "namespace": "data"}, "spec": {
            "containers": [{"name": "c", "image": "busybox", "env": [{"name": "TOKEN", "value": "s3cr3t"}],
                            "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}],
            "volumes": [{"name": "creds", "secret": {"secretName": "db-password"}}]}},
    ]  # fmt: skip


def test_snapshot_captures_the_cluster_without_secrets(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    with testing.running_cluster(SCENARIOS / "small.yaml", time_scale=10) as sim:
        sim.store.apply_objects(_extra())
        proc = spotguard("snapshot", "--kubeconfig", sim.kubeconfig, "-o", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "7 nodes, 4 workloads" in proc.stdout
    text = out.read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Node", "Namespace", "Deployment", "StatefulSet", "Pod", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= kinds  # fmt: skip
    # nothing secret, nothing the server owns
    assert "Secret" not in kinds and "hunter2" not in text and "s3cr3t" not in text
    for d in docs:
        meta = d["metadata"]
        assert not {"uid", "resourceVersion", "managedFields", "creationTimestamp"} & set(meta), d
        if d["kind"] != "Node":
            assert "status" not in d
    tool = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "tool")
    assert tool["spec"].get("volumes", []) == [] and tool["spec"]["containers"][0].get("volumeMounts", []) == []
    node = next(d for d in docs if d["kind"] == "Node")
    assert set(node["status"]) <= {"capacity", "allocatable", "nodeInfo", "addresses"} and node["status"]["allocatable"]
    # AND it loads as a scenario
    assert len(scenario.load(out)) >= len(docs)


def test_bad_arguments(tmp_path: Path) -> None:
    plain_error(spotguard("snapshot", "--kubeconfig", str(tmp_path / "nope"), "-o", str(tmp_path / "o.yaml"),
                          timeout=60), "no such file")  # fmt: skip
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    plain_error(spotguard("snapshot", "--kubeconfig", str(kubeconfig), "-o", str(tmp_path / "d" / "o.yaml"),
                          timeout=60), "does not exist")  # fmt: skip
    existing = tmp_path / "exists.yaml"
    existing.write_text("keep me")
    plain_error(spotguard("snapshot", "--kubeconfig", str(kubeconfig), "-o", str(existing), timeout=60), "--force")
    assert existing.read_text() == "keep me"
    # a cluster that does not answer: a sentence, and no file left behind
    proc = spotguard("snapshot", "--kubeconfig", str(kubeconfig), "-o", str(tmp_path / "o.yaml"), timeout=120)
    plain_error(proc, "could not")
    assert not (tmp_path / "o.yaml").exists()
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text("this: [is not a kubeconfig")
    plain_error(spotguard("snapshot", "--kubeconfig", str(bad), "-o", str(tmp_path / "o.yaml"), timeout=60),
                "kubeconfig")  # fmt: skip
    plain_error(spotguard("snapshot", timeout=60), "required")


def test_help_has_an_example() -> None:
    proc = spotguard("snapshot", "--help", timeout=60)
    assert proc.returncode == 0 and "spotguard snapshot --kubeconfig" in proc.stdout
