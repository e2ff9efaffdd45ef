"""Through SQS and the Lambda entry under API faults: duplicates, reordering, nothing lost, one surge each.

GIVEN three doomed spot nodes whose state changes (shutting-down) are put on the
bus before their interruption warnings, every warning delivered four times (the
same message body, as SQS's at-least-once delivery does), some messages that are
not notices, and one API request in five failing with a 500 (every Deployment
write, until a first notice is answered for redelivery)
WHEN the queue is drained the way the Lambda event source mapping does (batches
of ten; delete what the answer does not list; redeliver what it lists)
THEN the answers never list a message that is not a notice, every notice is
finally acknowledged, each node carries one taint and each Deployment surged
exactly once, by its pods on the doomed node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from spotguard.gateway import kube, resources
from spotguard_sim import testing

from tests.interruption.transport_support import (
    EC2_PATTERN,
    Moto,
    assert_copy_surge,
    deployment,
    interruption_taint,
    lambda_batch,
    lambda_function,
    node,
    pods_on,
    unique,
    wait_for,
)

NODES = {"spot-a": "i-0aaaaaaaaaaaaaaa0", "spot-b": "i-0bbbbbbbbbbbbbbb0", "spot-c": "i-0ccccccccccccccc0"}
REPLICAS = {"web": ("spot-a", 2), "api": ("spot-b", 3), "cart": ("spot-c", 1)}


@pytest.fixture
def setup(aws_env: Moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}]
    objects += [node(name, "spot", instance) for name, instance in NODES.items()]
    objects += [node("od-a", "on-demand", "i-0ddddddddddddddd0")]
    objects += [deployment(name, replicas, on) for name, (on, replicas) in REPLICAS.items()]
    sqs = aws_env.client("sqs")
    events = aws_env.client("events")
    queue_url = sqs.create_queue(QueueName=unique("faults"))["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = unique("spotguard-ec2")
    events.put_rule(Name=rule, EventPattern=json.dumps(EC2_PATTERN))
    events.put_targets(Rule=rule, Targets=[{"Id": "q", "Arn": queue_arn}])
    with testing.running_cluster(objects) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        for on, replicas in REPLICAS.values():
            wait_for(lambda on=on, replicas=replicas: len(pods_on(api, on)) == replicas, timeout=20)
        yield {"sim": sim, "api": api, "sqs": sqs, "events": events, "queue_url": queue_url, "queue_arn": queue_arn}


def put(events: Any, detail_type: str, detail: dict[str, str]) -> str:
    answer = events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": detail_type,
                "Detail": json.dumps(detail),
                "Resources": [f"arn:aws:ec2:us-east-2a:instance/{detail['instance-id']}"],
                "Time": datetime.now(UTC),
            }
        ]
    )
    assert answer["FailedEntryCount"] == 0
    return str(answer["Entries"][0]["EventId"])


def drain(setup: dict[str, Any], count: int) -> list[dict[str, Any]]:
    sqs, url = setup["sqs"], setup["queue_url"]
    got: list[dict[str, Any]] = []

    def more() -> bool:
        got.extend(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []))
        return len(got) >= count

    wait_for(more, timeout=20, interval=0)
    return got


def test_faults_duplicates_and_reordering_through_sqs(setup: dict[str, Any]) -> None:
    sim, api, sqs, url = setup["sim"], setup["api"], setup["sqs"], setup["queue_url"]
    # GIVEN the state changes first, then the warnings, through the EventBridge rule
    for instance in NODES.values():
        put(
            setup["events"],
            "EC2 Instance State-change Notification",
            {"instance-id": instance, "state": "shutting-down"},
        )
    warning = "EC2 Spot Instance Interruption Warning"
    warnings = {
        put(setup["events"], warning, {"instance-id": i, "instance-action": "terminate"}): n for n, i in NODES.items()
    }
    # AND each warning delivered three more times, plus messages that are not notices
    delivered = drain(setup, 6)
    for m in delivered:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        if json.loads(m["Body"])["detail-type"] == "EC2 Spot Instance Interruption Warning":
            for _ in range(3):
                sqs.send_message(QueueUrl=url, MessageBody=m["Body"])
    for junk in ["Hello from SQS!", json.dumps({"source": "aws.autoscaling", "detail-type": "x", "detail": {}})]:
        sqs.send_message(QueueUrl=url, MessageBody=junk)
    total = 6 + 3 * 3 + 2
    # AND one API request in five fails; every surge write (the copy's create, carrying its
    # record) fails until the first answer lists a notice for redelivery (so one certainly does,
    # whatever the random faults hit)
    sim.faults.set(error_rate=0.2, status=500)
    sim.faults.set(verb="create", resource="replicasets", error_rate=1.0, status=500)
    first_failure = True
    # WHEN the queue is drained as the event source mapping does
    handler = lambda_function()
    acknowledged: dict[str, str] = {}  # message id -> body
    retried = 0
    for _ in range(60):
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        messages = answer.get("Messages", [])
        if not messages:
            if len(acknowledged) == total:
                break
            continue
        result = handler.lambda_handler(lambda_batch(messages, setup["queue_arn"]), None)
        failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
        assert failed <= {m["MessageId"] for m in messages}
        if first_failure and failed:
            first_failure = False
            sim.faults.clear()
            sim.faults.set(error_rate=0.2, status=500)
        for m in messages:
            if m["MessageId"] in failed:
                # THEN a message listed for redelivery is always a notice
                assert json.loads(m["Body"])["source"] == "aws.ec2"
                retried += 1
                sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
            else:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                acknowledged[m["MessageId"]] = m["Body"]
    sim.faults.clear()
    # THEN every message was acknowledged in the end, some only after a redelivery
    assert len(acknowledged) == total
    assert sim.faults.injected > 0
    assert retried > 0
    # AND each node carries one taint, with its warning's event id
    for event_id, name in warnings.items():
        n = api.get(resources.NODES, name)
        assert [t["key"] for t in n["spec"].get("taints") or []].count("spotguard.io/interruption") == 1
        assert interruption_taint(n) == event_id
    # AND each Deployment surged exactly once, by its pods on the doomed node: one copy of
    # that size, its own count untouched
    for name, (_, replicas) in REPLICAS.items():
        record = assert_copy_surge(api, name, replicas, replicas)
        assert record["surge"] == replicas, (name, record)
    assert len(api.list(resources.REPLICASETS, "shop", label_selector="spotguard.io/surge-of")) == len(REPLICAS)
