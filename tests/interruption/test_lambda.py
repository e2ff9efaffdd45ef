"""The Lambda entry: an SQS batch, a direct EventBridge event, a schedule.

The first tests use a recording handler (they are about the shapes Lambda sends);
the last ones call ``functions/spot-interruption/lambda_function.py`` as Lambda
would, with the real handler on the simulated cluster and EC2 on moto.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.gateway import kube, resources
from spotguard.interruption import awslambda
from spotguard_sim import testing

from tests.interruption.transport_support import (
    SPOT_INSTANCE,
    Moto,
    RecordingHandler,
    assert_copy_surge,
    interruption_taint,
    lambda_function,
    pods_on,
    record,
    sample,
    scenario,
    wait_for,
)

# -- the shapes, with a recording handler ------------------------------------------------------


def test_an_sqs_batch_answers_batch_item_failures() -> None:
    handler = RecordingHandler(outcomes={SPOT_INSTANCE: "retry"})
    answer = awslambda.handle(sample("sqs-batch.json"), handler)
    assert answer == {
        "batchItemFailures": [
            {"itemIdentifier": "059f36b4-87a3-44ab-83d2-661975830a7d"},
            {"itemIdentifier": "2e1424d4-f796-459a-8184-9c92662be6da"},
            {"itemIdentifier": "c80e8021-a70a-42c7-a470-796e1186f753"},
        ]
    }


def test_a_direct_eventbridge_event_is_handled() -> None:
    handler = RecordingHandler()
    answer = awslambda.handle(sample("ec2-spot-instance-interruption-warning.json"), handler)
    assert answer["result"] == "done"
    assert answer["notice"]["instance_id"] == SPOT_INSTANCE
    assert [n.event_id for n in handler.calls[0]] == ["12345678-1234-1234-1234-123456789012"]


def test_a_direct_event_that_fails_transiently_raises_so_lambda_retries() -> None:
    handler = RecordingHandler(outcomes={SPOT_INSTANCE: "retry"})
    with pytest.raises(awslambda.RetryLater, match="deliver it again"):
        awslambda.handle(sample("ec2-spot-instance-interruption-warning.json"), handler)


@pytest.mark.parametrize(
    ("event", "result"),
    [
        (sample("ec2-spot-instance-interruption-warning.as-documented.json"), "malformed"),
        (sample("autoscaling-lifecycle-launch.json"), "foreign"),
        ({"hello": "world"}, "foreign"),
        (["not", "an", "object"], "malformed"),
        (None, "malformed"),
    ],
)
def test_a_direct_event_that_is_not_a_notice_is_acknowledged(event: Any, result: str) -> None:
    handler = RecordingHandler()
    answer = awslambda.handle(event, handler)
    assert answer["result"] == result
    assert answer["reason"]
    assert handler.calls == []


@pytest.mark.parametrize(
    "event",
    [
        sample("eventbridge-scheduled-event.json"),
        {"spotguard": "reconcile"},
        {"source": "aws.scheduler", "detail-type": "Scheduled Event"},
    ],
)
def test_a_schedule_runs_the_reconcile(event: Any) -> None:
    handler = RecordingHandler()
    assert awslambda.handle(event, handler) == {"result": "reconciled"}
    assert handler.reconciles == 1 and handler.calls == []


def test_a_failed_reconcile_raises() -> None:
    handler = RecordingHandler(reconcile_raises=ConnectionError("down"))
    with pytest.raises(awslambda.RetryLater):
        awslambda.handle({"spotguard": "reconcile"}, handler)


# -- lambda_function.py with the real handler ------------------------------------------------------


@pytest.fixture
def cluster(aws_env: Moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, kube.Kube]]:
    """The scenario on a simulated cluster, with the environment a deployed Lambda would have."""
    with testing.running_cluster(scenario()) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        wait_for(lambda: len(pods_on(api, "spot-a")) == 2, timeout=20)
        yield sim, api


def test_lambda_function_surges_from_an_sqs_batch(cluster: tuple[Any, kube.Kube]) -> None:
    _, api = cluster
    module = lambda_function()
    body = json.dumps(sample("ec2-spot-instance-interruption-warning.json"))
    foreign_instance = sample("ec2-spot-instance-interruption-warning.json")
    foreign_instance["id"] = "99999999-1234-1234-1234-123456789012"
    foreign_instance["detail"]["instance-id"] = "i-0ffffffffffffffff"
    batch = {
        "Records": [
            record(body, "m-1"),
            record(body, "m-2"),  # a duplicate delivery
            record(json.dumps(foreign_instance), "m-3"),  # another cluster's instance
            record("Hello from SQS!", "m-4"),
        ]
    }
    # WHEN Lambda calls the function
    answer = module.lambda_handler(batch, None)
    # THEN nothing comes back, the node is tainted with the event id and the Deployment surged:
    # its copy holds the two pods on spot-a, its own count is untouched
    assert answer == {"batchItemFailures": []}
    node = api.get(resources.NODES, "spot-a")
    assert interruption_taint(node) == "12345678-1234-1234-1234-123456789012"
    surge = assert_copy_surge(api, "web", 2, 2)
    assert surge["surge"] == 2 and surge["events"] == ["12345678-1234-1234-1234-123456789012"]
    # AND the same batch again changes nothing (idempotent)
    assert module.lambda_handler(batch, None) == {"batchItemFailures": []}
    assert assert_copy_surge(api, "web", 2, 2) == surge


def test_lambda_function_reports_only_the_failed_messages(cluster: tuple[Any, kube.Kube]) -> None:
    sim, api = cluster
    module = lambda_function()
    # GIVEN every node write fails on the API server
    sim.faults.set(verb="patch", resource="nodes", error_rate=1.0, status=500)
    batch = {
        "Records": [
            record(json.dumps(sample("ec2-spot-instance-interruption-warning.json")), "m-doomed"),
            record(json.dumps(sample("autoscaling-lifecycle-launch.json")), "m-foreign"),
            record("{", "m-malformed"),
        ]
    }
    # WHEN the batch is handled, THEN only the notice that could not be written comes back
    assert module.lambda_handler(batch, None) == {"batchItemFailures": [{"itemIdentifier": "m-doomed"}]}
    # AND once the API server recovers, the redelivery completes it
    sim.faults.clear()
    assert module.lambda_handler({"Records": [batch["Records"][0]]}, None) == {"batchItemFailures": []}
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == "12345678-1234-1234-1234-123456789012"


def test_lambda_function_direct_event_and_schedule(cluster: tuple[Any, kube.Kube]) -> None:
    _, api = cluster
    module = lambda_function()
    event = sample("ec2-spot-instance-interruption-warning.nth.json")  # spot-b, no pods
    answer = module.lambda_handler(event, None)
    assert answer["result"] == "done"
    assert interruption_taint(api.get(resources.NODES, "spot-b")) == event["id"]
    assert module.lambda_handler(sample("eventbridge-scheduled-event.json"), None) == {"result": "reconciled"}
    assert module.lambda_handler({"spotguard": "reconcile"}, None) == {"result": "reconciled"}


def test_lambda_function_with_the_cluster_unreachable(
    aws_env: Moto, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # GIVEN a kubeconfig whose API server is a closed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    batch = {
        "Records": [
            record(json.dumps(sample("ec2-spot-instance-interruption-warning.json")), "m-notice"),
            record("Hello from SQS!", "m-text"),
        ]
    }
    # WHEN Lambda calls the function, THEN the notice comes back, the text message does not
    answer = lambda_function().lambda_handler(batch, None)
    assert answer == {"batchItemFailures": [{"itemIdentifier": "m-notice"}]}
    # AND a batch without notices never needs the cluster
    assert lambda_function().lambda_handler({"Records": [batch["Records"][1]]}, None) == {"batchItemFailures": []}
