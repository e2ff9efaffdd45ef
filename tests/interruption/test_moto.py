"""EventBridge -> SQS -> Lambda, end to end on moto in server mode and the simulated cluster.

GIVEN an EventBridge rule with the EC2 event pattern targeting an SQS queue
WHEN the AWS sample events are put on the bus, received from the queue and handed
to ``lambda_handler`` in the exact Lambda SQS batch shape
THEN the simulated cluster shows the taint and the surge, and the partial batch
answer lists only the messages that failed.

moto accepts PutEvents with source ``aws.ec2`` (real AWS reserves ``aws.*``
sources for its services, so there the events come from EC2 itself) and delivers
matching events to the SQS target as AWS does: the event JSON as the message
body, a new event id, the Time given, no ``account`` field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from spotguard.gateway import kube, resources
from spotguard.policy import surgecopy
from spotguard_sim import objects, testing

from tests.interruption.transport_support import (
    EC2_PATTERN,
    NTH_INSTANCE,
    SPOT_INSTANCE,
    Moto,
    RecordingHandler,
    assert_copy_surge,
    interruption_taint,
    lambda_batch,
    lambda_function,
    pods_on,
    record,
    sample,
    scenario,
    surge_copy,
    unique,
    wait_for,
)


@pytest.fixture
def bus(aws_env: Moto) -> dict[str, Any]:
    """A queue fed by an EC2 rule, as infra/aws deploys them."""
    sqs = aws_env.client("sqs")
    events = aws_env.client("events")
    queue_url = sqs.create_queue(QueueName=unique("spot-interruptions"))["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = unique("spotguard-ec2")
    events.put_rule(Name=rule, EventPattern=json.dumps(EC2_PATTERN), State="ENABLED")
    events.put_targets(Rule=rule, Targets=[{"Id": "spotguard-queue", "Arn": queue_arn}])
    return {"sqs": sqs, "events": events, "queue_url": queue_url, "queue_arn": queue_arn}


@pytest.fixture
def cluster(bus: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, kube.Kube]]:
    with testing.running_cluster(scenario()) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        wait_for(lambda: len(pods_on(api, "spot-a")) == 2, timeout=20)
        yield sim, api


def put(bus: dict[str, Any], *names: str) -> list[str]:
    """PutEvents the samples as EC2 would emit them now; returns the new event ids."""
    entries = []
    for name in names:
        event = sample(name)
        entries.append(
            {
                "Source": event["source"],
                "DetailType": event["detail-type"],
                "Detail": json.dumps(event["detail"]),
                "Resources": event["resources"],
                "Time": datetime.now(UTC),
            }
        )
    answer = bus["events"].put_events(Entries=entries)
    assert answer["FailedEntryCount"] == 0
    return [entry["EventId"] for entry in answer["Entries"]]


def receive(bus: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Receive ``count`` messages (as the Lambda event source mapping would)."""
    messages: list[dict[str, Any]] = []

    def more() -> bool:
        answer = bus["sqs"].receive_message(
            QueueUrl=bus["queue_url"],
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages.extend(answer.get("Messages", []))
        return len(messages) >= count

    wait_for(more, timeout=15, interval=0)
    return messages


def settle(bus: dict[str, Any], messages: list[dict[str, Any]], answer: dict[str, Any]) -> None:
    """What Lambda does with the answer: delete every message not listed as failed."""
    failed = {f["itemIdentifier"] for f in answer["batchItemFailures"]}
    for m in messages:
        if m["MessageId"] not in failed:
            bus["sqs"].delete_message(QueueUrl=bus["queue_url"], ReceiptHandle=m["ReceiptHandle"])


def test_eventbridge_rule_to_sqs_to_lambda_taints_and_surges(
    bus: dict[str, Any], cluster: tuple[Any, kube.Kube]
) -> None:
    _, api = cluster
    # GIVEN the three AWS samples and an Auto Scaling event put on the bus
    ids = put(
        bus,
        "ec2-spot-instance-interruption-warning.json",  # i-1234567890abcdef0: spot-a, two web pods
        "ec2-instance-rebalance-recommendation.nth.json",  # i-0b662ef9931388ba0: spot-b
        "ec2-instance-state-change-notification.json",  # pending: nothing to do
        "autoscaling-lifecycle-terminate.json",  # not matched by the rule
    )
    # WHEN the queue is read and the messages handed to lambda_handler in the Lambda SQS shape
    messages = receive(bus, 3)
    bodies = [json.loads(m["Body"]) for m in messages]
    assert sorted(b["id"] for b in bodies) == sorted(ids[:3])  # the rule filtered the fourth
    batch = lambda_batch(messages, bus["queue_arn"])
    assert set(batch["Records"][0]) == {
        "messageId", "receiptHandle", "body", "attributes", "messageAttributes",
        "md5OfBody", "eventSource", "eventSourceARN", "awsRegion",
    }  # fmt: skip
    answer = lambda_function().lambda_handler(batch, None)
    settle(bus, messages, answer)
    # THEN nothing is retried
    assert answer == {"batchItemFailures": []}
    # AND spot-a carries the interruption taint with the warning's event id
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == ids[0]
    # AND the rebalance recommendation tainted spot-b (the default rebalance action)
    assert interruption_taint(api.get(resources.NODES, "spot-b")) == ids[1]
    # AND web surged by the two replicas on spot-a: its copy of two, recorded on the Deployment
    record = assert_copy_surge(api, "web", 2, 2)
    assert ids[0] in record["events"]
    # AND the queue is empty
    assert bus["sqs"].receive_message(QueueUrl=bus["queue_url"], WaitTimeSeconds=0).get("Messages", []) == []


def test_failed_messages_come_back_and_malformed_ones_do_not(
    bus: dict[str, Any], cluster: tuple[Any, kube.Kube]
) -> None:
    sim, api = cluster
    # GIVEN a warning for spot-a, a warning for an instance of another cluster, and two
    # messages that are not notices at all, sent to the queue directly
    ids = put(bus, "ec2-spot-instance-interruption-warning.json")
    foreign = sample("ec2-spot-instance-interruption-warning.json")
    foreign["detail"]["instance-id"] = "i-0ffffffffffffffff"
    bus["sqs"].send_message(QueueUrl=bus["queue_url"], MessageBody=json.dumps(foreign))
    bus["sqs"].send_message(QueueUrl=bus["queue_url"], MessageBody="Hello from SQS!")
    bus["sqs"].send_message(
        QueueUrl=bus["queue_url"],
        MessageBody=json.dumps(sample("ec2-spot-instance-interruption-warning.as-documented.json")),
    )
    messages = receive(bus, 4)
    doomed = next(m["MessageId"] for m in messages if json.loads(m["Body"]).get("id") == ids[0])
    # AND every node write fails on the API server
    sim.faults.set(verb="patch", resource="nodes", error_rate=1.0, status=500)
    # WHEN the batch is handled
    answer = lambda_function().lambda_handler(lambda_batch(messages, bus["queue_arn"]), None)
    settle(bus, messages, answer)
    # THEN only the warning for spot-a comes back
    assert answer == {"batchItemFailures": [{"itemIdentifier": doomed}]}
    assert interruption_taint(api.get(resources.NODES, "spot-a")) is None
    # AND after the API server recovers, its redelivery (the only message left) completes the work
    sim.faults.clear()
    again = receive_after_visibility(bus, messages, doomed)
    assert [m["MessageId"] for m in again] == [doomed]
    answer = lambda_function().lambda_handler(lambda_batch(again, bus["queue_arn"]), None)
    assert answer == {"batchItemFailures": []}
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == ids[0]
    # AND web is surged by its copy for its two pods on spot-a (the copy's own pods are pinned
    # to on-demand: none is bound there while spot-a's taint was failing)
    record = assert_copy_surge(api, "web", 2, 2)
    assert record["counts"]["spot-a"] == 2
    assert len(pods_on(api, "spot-a")) == 2


def receive_after_visibility(
    bus: dict[str, Any], messages: list[dict[str, Any]], message_id: str
) -> list[dict[str, Any]]:
    """Receive a failed message again: end its visibility timeout now rather than wait 30 s."""
    handle = next(m["ReceiptHandle"] for m in messages if m["MessageId"] == message_id)
    bus["sqs"].change_message_visibility(QueueUrl=bus["queue_url"], ReceiptHandle=handle, VisibilityTimeout=0)
    return receive(bus, 1)


def test_the_sample_instances_match_the_scenario() -> None:
    # The scenario's nodes carry the instance ids the AWS samples name.
    provider_ids = {n["spec"]["providerID"] for n in scenario() if n["kind"] == "Node"}
    assert f"aws:///us-east-2a/{SPOT_INSTANCE}" in provider_ids
    assert f"aws:///us-east-2b/{NTH_INSTANCE}" in provider_ids


def test_a_failed_notice_comes_back_within_seconds_not_after_the_visibility_timeout(
    bus: dict[str, Any], cluster: tuple[Any, kube.Kube], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, api = cluster
    # GIVEN the queue as infra/aws deploys it (visibility 30 s) and the Lambda's retry delay
    bus["sqs"].set_queue_attributes(QueueUrl=bus["queue_url"], Attributes={"VisibilityTimeout": "30"})
    monkeypatch.setenv("SPOTGUARD_SQS_RETRY_SECONDS", "1")
    [event_id] = put(bus, "ec2-spot-instance-interruption-warning.json")
    messages = receive(bus, 1)
    # WHEN every surge write fails (the copy's create, carrying its record: the API server answers 500)
    sim.faults.set(verb="create", resource="replicasets", error_rate=1.0, status=500)
    function = lambda_function()
    answer = function.lambda_handler(lambda_batch(messages, bus["queue_arn"]), None)
    settle(bus, messages, answer)
    sim.faults.clear()
    # THEN the message is reported failed
    assert answer == {"batchItemFailures": [{"itemIdentifier": messages[0]["MessageId"]}]}
    # AND it is delivered again well before the queue's 30 s visibility timeout would allow
    again = receive(bus, 1)
    assert again[0]["MessageId"] == messages[0]["MessageId"]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # AND the retry completes the handling: the surge is written
    answer = function.lambda_handler(lambda_batch(again, bus["queue_arn"]), None)
    settle(bus, again, answer)
    assert answer == {"batchItemFailures": []}
    web = surge_copy(api, "web")
    assert web is not None and event_id in json.loads(web["metadata"]["annotations"][surgecopy.RECORD])["events"]


def test_fifo_a_failed_message_takes_the_rest_of_its_group_with_it() -> None:
    from spotguard.interruption import sqs

    # GIVEN a FIFO batch: two groups, the first message of group a fails
    def rec(message_id: str, group: str, instance: str) -> dict[str, Any]:
        body = sample("ec2-spot-instance-interruption-warning.json")
        body["detail"]["instance-id"] = instance
        r = record(json.dumps(body), message_id)
        r["attributes"]["MessageGroupId"] = group
        return r

    batch = {"Records": [rec("m1", "a", "i-fail"), rec("m2", "b", "i-ok"), rec("m3", "a", "i-ok2")]}
    handler = RecordingHandler(outcomes={"i-fail": "retry"})
    # WHEN it is handled
    answer = sqs.handle_batch(batch, handler)
    # THEN the failed message and every later one of its group are reported, the other group is not
    assert answer == {"batchItemFailures": [{"itemIdentifier": "m1"}, {"itemIdentifier": "m3"}]}


def test_a_warm_lambda_rereads_the_settings_at_their_ttl(
    cluster: tuple[Any, kube.Kube], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, api = cluster
    monkeypatch.setenv("SPOTGUARD_CONFIG_TTL_SECONDS", "0")
    # GIVEN the settings say: ignore rebalance recommendations
    sim.store.apply_objects(
        [
            objects.namespace("spotguard"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "spotguard-config", "namespace": "spotguard"},
                "data": {"rebalance-action": "ignore"},
            },
        ]
    )
    function = lambda_function()
    event = sample("ec2-instance-rebalance-recommendation.json")
    event["detail"]["instance-id"] = SPOT_INSTANCE
    event["time"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # WHEN a rebalance recommendation arrives (a direct EventBridge invocation)
    assert function.lambda_handler({**event, "id": "rbl-1"}, None)["result"] == "ignored"
    assert interruption_taint(api.get(resources.NODES, "spot-a")) is None
    # AND the ConfigMap is edited; the same warm function gets the next one
    sim.store.mutate(
        "configmaps", "spotguard-config", "spotguard", lambda c: c["data"].update({"rebalance-action": "taint"})
    )
    assert function.lambda_handler({**event, "id": "rbl-2"}, None)["result"] == "done"
    # THEN the new setting applied
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == "rbl-2"
