"""`spotguard serve spot-interruption` as a process: CloudEvents over real HTTP, the SQS poller, SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from spotguard.gateway import kube, resources
from spotguard_sim import testing

from tests.interruption.transport_support import (
    REGION,
    Moto,
    assert_copy_surge,
    interruption_taint,
    pods_on,
    sample,
    scenario,
    unique,
    wait_for,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(moto_server: Moto) -> Iterator[dict[str, Any]]:
    with testing.running_cluster(scenario()) as sim:
        api = kube.connect(sim.kubeconfig)
        wait_for(lambda: len(pods_on(api, "spot-a")) == 2, timeout=20)
        sqs = moto_server.client("sqs")
        queue_url = sqs.create_queue(QueueName=unique("served"))["QueueUrl"]
        port = free_port()
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
            "SPOTGUARD_LOG_LEVEL": "INFO",
        }
        env.pop("AWS_PROFILE", None)
        command = [
            sys.executable, "-m", "spotguard.cli", "serve", "spot-interruption",
            "--port", str(port), "--kubeconfig", sim.kubeconfig,
            "--sqs-queue-url", queue_url, "--region", REGION, "--endpoint-url", moto_server.url,
            "--wait-seconds", "1", "--reconcile-interval", "1",
        ]  # fmt: skip
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the server exited: {process.communicate()[1].decode()[-2000:]}")
            try:
                return requests.get(f"{url}/healthz", timeout=1).ok
            except requests.ConnectionError:
                return False

        try:
            wait_for(up, timeout=30, interval=0.1)
            yield {"url": url, "process": process, "api": api, "sqs": sqs, "queue_url": queue_url, "sim": sim}
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def queued(sqs: Any, queue_url: str) -> int:
    """Messages on the queue, visible or in flight."""
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def post_sample(url: str, name: str) -> requests.Response:
    payload = sample(name)
    return requests.post(f"{url}/", headers=payload["headers"], data=payload["body"].encode(), timeout=30)


def test_serves_cloudevents_polls_sqs_and_stops_on_sigterm(served: dict[str, Any]) -> None:
    url, api, process = served["url"], served["api"], served["process"]
    # GIVEN a CloudEvent in binary mode (the IntegrationSource's aws-sqs event) for spot-a
    response = post_sample(url, "cloudevent-aws-sqs.binary.json")
    # THEN it is handled: 200, a result CloudEvent, the taint and the surge
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/cloudevents+json")
    assert json.loads(response.content)["data"]["result"] == "done"
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == "12345678-1234-1234-1234-123456789012"
    assert_copy_surge(api, "web", 2, 2)  # web's copy holds its two pods on spot-a
    # AND a structured-mode ping runs the reconcile; a request that is not a CloudEvent gets 400
    assert json.loads(post_sample(url, "cloudevent-ping.structured.json").content)["data"]["result"] == "reconciled"
    plain = requests.post(f"{url}/", json=sample("ec2-spot-instance-interruption-warning.json"), timeout=10)
    assert plain.status_code == 400
    # WHEN a notice for spot-b arrives on the queue
    body = sample("ec2-spot-instance-interruption-warning.nth.json")
    served["sqs"].send_message(QueueUrl=served["queue_url"], MessageBody=json.dumps(body))
    # THEN the poller handles it and deletes the message
    wait_for(lambda: interruption_taint(api.get(resources.NODES, "spot-b")) == body["id"], timeout=20)
    # (deleted, not just in flight: a receive of the test's own would only hide it, and the
    # handler counts a notice before it deletes the message)
    wait_for(lambda: queued(served["sqs"], served["queue_url"]) == 0, timeout=20)
    # AND the metrics count what happened
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert 'spotguard_interruption_notices_received_total{kind="interruption",result="done"} 2.0' in metrics
    assert "spotguard_interruption_reconciles_total" in metrics
    assert "spotguard_interruption_notice_age_seconds_bucket" in metrics
    # (the handler's own metrics are served too: the time from notice to surge)
    assert re.search(r"^spotguard_interruption_notice_to_surge_seconds_count [1-9]", metrics, re.MULTILINE)
    # WHEN it is sent SIGTERM, THEN it stops cleanly and soon
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert time.monotonic() - started < 15
    logs = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    assert any(line["msg"] == "stopped polling SQS" for line in logs)
    assert any(line.get("event_id") == body["id"] and line["msg"] == "notice done" for line in logs)


def test_bad_flags_are_user_errors(tmp_path: Any) -> None:
    missing = tmp_path / "nope"
    result = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "serve", "spot-interruption", "--kubeconfig", str(missing)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "no such file" in result.stderr.decode()
    result = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "serve", "spot-interruption", "--wait-seconds", "30"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--wait-seconds must be 0 to 20" in result.stderr.decode()
