"""`spotguard replay`: every kind of event file, against a cluster, a scenario and a running function."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spotguard.interruption import cloudevents as ce
from spotguard.ops import eventfiles
from spotguard_sim import readiness, testing

from tests.ops.support import EVENTS, SCENARIOS, last_json, plain_error, spotguard

SAMPLES = Path(__file__).resolve().parents[1] / "events"
KINDS = {
    "admission-review.json": "admission-review",
    "apiserversource-node-added.json": "apiserversource",
    "cloudevent-aws-sqs.json": "cloudevent",
    "eventbridge-scheduled-event.json": "schedule",
    "eventbridge-spot-interruption.json": "eventbridge",
    "lambda-sqs-batch.json": "lambda-sqs-batch",
    "pingsource.json": "pingsource",
    "sqs-message.json": "sqs-message",
}


def test_each_example_file_is_recognised() -> None:
    assert {p.name for p in EVENTS.glob("*.json")} == set(KINDS)
    for name, kind in KINDS.items():
        assert eventfiles.read(EVENTS / name).kind == kind, name


def test_an_instance_running_goes_to_node_added() -> None:
    # On AWS, an EC2 instance entering "running" is node-added's trigger, not spot-interruption's.
    sample = json.loads((Path(__file__).resolve().parents[1] / "events" / "ec2-instance-state-change-notification.json")
                        .read_text())  # fmt: skip
    sample["detail"]["state"] = "running"
    f = eventfiles.recognise(Path("running.json"), sample)
    assert f.kind == "eventbridge" and f.function == "node-added"
    sample["detail"]["state"] = "shutting-down"
    assert eventfiles.recognise(Path("x.json"), sample).function == "spot-interruption"


def test_the_scheduler_input_is_a_reconcile(tmp_path: Path) -> None:
    # GIVEN what the SAM template's EventBridge Scheduler schedules send (node-added's reconcile trigger)
    scheduler = SAMPLES / "eventbridge-scheduler-input.json"
    assert eventfiles.read(scheduler).kind == "schedule"
    assert eventfiles.recognise(Path("x.json"), {"spotguard": "reconcile"}).kind == "schedule"
    # WHEN the folder of real samples is replayed (the scheduler input among them)
    proc = spotguard("replay", str(SAMPLES), "--scenario", str(SCENARIOS / "demo.yaml"), "--dry-run",
                     "--output", "json")  # fmt: skip
    # THEN every file is replayed, and the scheduler input runs both reconciles
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {Path(r["file"]).name: r for r in last_json(proc)["results"]}
    assert set(results) == {p.name for p in SAMPLES.glob("*.json")}
    ran = results[scheduler.name]
    assert ran["kind"] == "schedule" and ran["result"] == "planned", ran
    assert any(line.startswith("spot-interruption: ") for line in ran["plan"]), ran
    assert any("dry run: nothing written" in line for line in ran["plan"]), ran


def test_an_unreachable_cluster_is_one_line_and_a_usage_error(tmp_path: Path) -> None:
    # GIVEN a kubeconfig whose API server does not answer
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    # WHEN an event is replayed against it THEN one sentence naming the cluster, exit 2
    proc = spotguard("replay", str(EVENTS / "eventbridge-spot-interruption.json"), "--kubeconfig", str(kubeconfig),
                     timeout=120)  # fmt: skip
    plain_error(proc, "cannot reach the cluster", str(kubeconfig), "https://127.0.0.1:9")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_real_aws_samples_are_recognised() -> None:
    samples = Path(__file__).resolve().parents[1] / "events"
    assert eventfiles.read(samples / "sqs-batch.json").kind == "lambda-sqs-batch"
    assert eventfiles.read(samples / "ec2-spot-instance-interruption-warning.json").kind == "eventbridge"
    assert eventfiles.read(samples / "cloudevent-aws-sqs.binary.json").kind == "cloudevent"
    assert eventfiles.read(samples / "cloudevent-ping.structured.json").kind == "pingsource"
    assert eventfiles.read(samples / "eventbridge-scheduled-event.json").kind == "schedule"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """The demo scenario's cluster, every pod Ready (placed by the scheduler alone)."""
    with testing.running_cluster(SCENARIOS / "demo.yaml", time_scale=20) as sim:
        want = 4 + 3 + 1 + 1 + 3 + 1

        def ready() -> bool:
            return sum(1 for p in sim.store.list("pods")[0] if readiness.is_ready(p)) >= want

        import time

        deadline = time.monotonic() + 60
        while not ready():
            assert time.monotonic() < deadline, "the scenario's pods never became Ready"
            time.sleep(0.1)
        yield sim


def _taints(sim: Any, node: str) -> list[dict[str, Any]]:
    return list(sim.store.get("nodes", node).get("spec", {}).get("taints") or [])


def test_dry_run_writes_nothing_then_the_real_replay_taints(cluster: Any) -> None:
    event = EVENTS / "eventbridge-spot-interruption.json"  # spot-1
    versions = {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in cluster.store.list("nodes")[0]}
    deployments = {d["metadata"]["name"]: d["spec"]["replicas"] for d in cluster.store.list("deployments")[0]}
    # WHEN replayed with --dry-run
    proc = spotguard("replay", str(event), "--kubeconfig", cluster.kubeconfig, "--dry-run", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    [result] = last_json(proc)["results"]
    # THEN it prints the plan with reasons and writes nothing
    assert result["result"] == "planned" and result["kind"] == "eventbridge"
    assert any(line.startswith("taint node spot-1") for line in result["plan"]), result["plan"]
    assert {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in cluster.store.list("nodes")[0]} == versions
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in cluster.store.list("deployments")[0]} == deployments
    # WHEN replayed for real THEN spot-1 carries the interruption taint with the event's id
    proc = spotguard("replay", str(event), "--kubeconfig", cluster.kubeconfig)
    assert proc.returncode == 0, proc.stderr
    assert "-> spot-interruption: done" in proc.stdout
    taints = _taints(cluster, "spot-1")
    assert any(t["key"] == "spotguard.io/interruption" and t["value"].startswith("5c6c8f0e") for t in taints)


def test_admission_review_against_a_cluster(cluster: Any) -> None:
    proc = spotguard("replay", str(EVENTS / "admission-review.json"), "--kubeconfig", cluster.kubeconfig,
                     "--dry-run", "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [result] = last_json(proc)["results"]
    assert result["response"]["allowed"] is True
    assert {op["path"] for op in result["patch"]} >= {"/metadata/labels/spotguard.io~1placement"}


def test_every_kind_against_a_scenario_dry_run() -> None:
    proc = spotguard("replay", str(EVENTS), "--scenario", str(SCENARIOS / "demo.yaml"), "--dry-run", "--output", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {Path(r["file"]).name: r for r in last_json(proc)["results"]}
    assert {n: r["kind"] for n, r in results.items()} == KINDS
    for name, r in results.items():
        assert r["result"] == "planned", (name, r)
    # node-added's pass runs for the node addition and the pings (and writes nothing)
    for name in ("apiserversource-node-added.json", "pingsource.json", "eventbridge-scheduled-event.json"):
        assert any(line.startswith("node-added: ") for line in results[name]["plan"]), results[name]
        assert any("dry run: nothing written" in line for line in results[name]["plan"]), results[name]
    assert any("spot-4" in line for line in results["cloudevent-aws-sqs.json"]["plan"])
    assert any("ordinal 2" in line for line in results["admission-review.json"]["plan"])


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[dict[str, str], bytes]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        Recorder.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(Recorder.status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"result": "ok"}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def function_url() -> Iterator[str]:
    Recorder.seen = []
    Recorder.status = 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()


def test_to_url_posts_what_the_transport_would(function_url: str) -> None:
    files = [EVENTS / n for n in ("eventbridge-spot-interruption.json", "lambda-sqs-batch.json", "pingsource.json",
                                  "admission-review.json")]  # fmt: skip
    proc = spotguard("replay", *map(str, files), "--to", function_url, "--output", "json")
    assert proc.returncode == 0, proc.stderr
    assert len(Recorder.seen) == 4
    # the EventBridge event and the batch's record go as Knative's SQS source sends them; spotguard reads them back
    for headers, body in Recorder.seen[:2]:
        event = ce.decode_http(headers, body)
        assert event.get_type() == "dev.knative.eventing.aws-sqs"
        assert ce.delivery(event).notice is not None
    assert ce.decode_http(*Recorder.seen[2]).get_type() == "dev.knative.sources.ping"
    assert json.loads(Recorder.seen[3][1])["kind"] == "AdmissionReview"


def test_to_url_a_503_is_a_retry(function_url: str) -> None:
    Recorder.status = 503
    proc = spotguard("replay", str(EVENTS / "pingsource.json"), "--to", function_url)
    assert proc.returncode == 1
    assert "retry" in proc.stdout


def test_bad_files(tmp_path: Path) -> None:
    cases = {
        "notjson.json": ("{not json", "is not JSON"),
        "array.json": ("[1, 2]", "one JSON object"),
        "unknown.json": ('{"hello": "world"}', "not an event spotguard knows"),
        "review.json": ('{"kind": "AdmissionReview"}', "without a request"),
        "badce.json": ('{"headers": {"ce-type": "x"}, "body": "{}"}', "binary mode"),
    }
    for name, (text, words) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        plain_error(spotguard("replay", str(path), "--scenario", str(SCENARIOS / "demo.yaml"), timeout=60), words)
    empty = tmp_path / "empty"
    empty.mkdir()
    plain_error(spotguard("replay", str(empty), "--kubeconfig", "x", timeout=60), "no .json event files")
    plain_error(spotguard("replay", str(tmp_path / "none.json"), "--kubeconfig", "x", timeout=60), "no such file")


def test_bad_arguments(tmp_path: Path) -> None:
    event = str(EVENTS / "pingsource.json")
    plain_error(spotguard("replay", event, timeout=60), "--kubeconfig", "--scenario", "--to")
    plain_error(spotguard("replay", event, "--to", "http://x/", "--dry-run", timeout=60), "--dry-run")
    plain_error(spotguard("replay", event, "--to", "ftp://x/", timeout=60), "http://")
    plain_error(spotguard("replay", event, "--kubeconfig", str(tmp_path / "k"), timeout=60), "no such file")
    plain_error(spotguard("replay", event, "--kubeconfig", "a", "--scenario", "b", timeout=60), "not allowed with")
    plain_error(spotguard("replay", timeout=60), "required")


def test_help_has_an_example() -> None:
    proc = spotguard("replay", "--help", timeout=60)
    assert proc.returncode == 0 and "spotguard replay infra/events/" in proc.stdout
