"""Other clusters' notices are acknowledged, never retried into the dead-letter queue.

The EventBridge rules match every instance of the account and region, so the
queue carries every cluster's notices. End to end on moto in server mode (SQS
with a dead-letter queue as infra/aws deploys it, EC2, IAM) and the Lambda
handler, drained as the event source mapping does:

GIVEN a spot-interruption Lambda whose role may not call ec2:DescribeInstances
(moto enforcing IAM), and a notice for an instance no node of this cluster runs
WHEN the queue is drained several times
THEN the notice is acknowledged at its first delivery (not in batchItemFailures),
deleted, absent from the dead-letter queue, and logged.

GIVEN the managed tag setting (aws-node-termination-handler's
``aws-node-termination-handler/managed``), an untagged instance of another VPC whose
private DNS name is also the name of a node here (overlapping CIDRs), and a tagged
instance of this cluster whose node has no providerID
WHEN both instances' interruption warnings are delivered
THEN both are acknowledged; only the tagged instance's node is tainted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from spotguard.gateway import kube, resources
from spotguard_sim import objects, testing

from tests.interruption.transport_support import (
    REGION,
    Moto,
    interruption_taint,
    lambda_batch,
    lambda_function,
    node,
    unique,
    wait_for,
)

MANAGED_TAG = "aws-node-termination-handler/managed"
FOREIGN_LOG = "notice for an instance that is not in this cluster: acknowledged"


@pytest.fixture
def queues(aws_env: Moto) -> dict[str, Any]:
    return make_queues(aws_env.client("sqs"))


def make_queues(sqs: Any) -> dict[str, Any]:
    """The notice queue and its dead-letter queue (maxReceiveCount 2, visibility 0 s to drain fast)."""
    dlq_url = sqs.create_queue(QueueName=unique("notices-dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    url = sqs.create_queue(
        QueueName=unique("notices"), Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "0"}
    )["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return {"sqs": sqs, "url": url, "arn": arn, "dlq_url": dlq_url}


def warning(instance_id: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": unique("event"),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    )


def drain(queues: dict[str, Any], rounds: int) -> list[list[str]]:
    """Receive and hand to a fresh Lambda, delete what it acknowledged: as the event source mapping does."""
    sqs = queues["sqs"]
    failures: list[list[str]] = []
    function = lambda_function()
    for _ in range(rounds):
        got = sqs.receive_message(
            QueueUrl=queues["url"], MaxNumberOfMessages=10, AttributeNames=["All"], WaitTimeSeconds=0
        ).get("Messages", [])
        if not got:
            continue
        answer = function.lambda_handler(lambda_batch(got, queues["arn"]), None)
        failed = [f["itemIdentifier"] for f in answer["batchItemFailures"]]
        failures.append(failed)
        for message in got:
            if message["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=queues["url"], ReceiptHandle=message["ReceiptHandle"])
    return failures


def count(queues: dict[str, Any], which: str) -> int:
    attrs = queues["sqs"].get_queue_attributes(
        QueueUrl=queues[which],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def foreign_logged(caplog: pytest.LogCaptureFixture, instance_id: str) -> bool:
    return any(r.getMessage() == FOREIGN_LOG and getattr(r, "instance_id", "") == instance_id for r in caplog.records)


@pytest.fixture
def denied_keys(aws_env: Moto) -> Iterator[dict[str, str]]:
    """moto enforcing IAM: an admin's keys for the test, and the function's keys (SQS only, no EC2)."""
    iam = aws_env.client("iam")
    keys = {}
    for who, policy in (
        ("admin", {"Effect": "Allow", "Action": "*", "Resource": "*"}),
        ("function", {"Effect": "Allow", "Action": ["sqs:*", "eks:DescribeCluster"], "Resource": "*"}),
    ):
        name = unique(f"spotguard-{who}")
        iam.create_user(UserName=name)
        iam.put_user_policy(
            UserName=name,
            PolicyName="p",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [policy]}),
        )
        key = iam.create_access_key(UserName=name)["AccessKey"]
        keys[who] = key["AccessKeyId"]
        keys[f"{who}-secret"] = key["SecretAccessKey"]
    requests.post(f"{aws_env.url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        yield keys
    finally:
        requests.post(f"{aws_env.url}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()


def test_a_notice_of_another_cluster_is_acknowledged_when_ec2_refuses_the_lookup(
    aws_env: Moto,
    denied_keys: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import boto3

    admin = {"aws_access_key_id": denied_keys["admin"], "aws_secret_access_key": denied_keys["admin-secret"]}
    queues = make_queues(boto3.client("sqs", endpoint_url=aws_env.url, region_name=REGION, **admin))
    # The function runs as the user without ec2:DescribeInstances.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", denied_keys["function"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", denied_keys["function-secret"])
    monkeypatch.setenv("SPOTGUARD_SQS_RETRY_SECONDS", "0")
    foreign = "i-0f0f0f0f0f0f0f0f0"
    cluster = [objects.namespace("shop"), node("spot-a", "spot", "i-0aaaaaaaaaaaaaaa0")]
    with testing.running_cluster(cluster) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        queues["sqs"].send_message(QueueUrl=queues["url"], MessageBody=warning(foreign))
        with caplog.at_level(logging.INFO):
            failures = drain(queues, rounds=4)
    assert failures == [[]], "the foreign notice was handed back for a retry"
    assert count(queues, "url") == 0
    assert count(queues, "dlq_url") == 0
    assert foreign_logged(caplog, foreign)


def test_the_managed_tag_keeps_another_vpcs_instance_off_a_node_of_the_same_name(
    aws_env: Moto, queues: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ec2 = aws_env.client("ec2")
    image = ec2.register_image(Name=unique("ami"), RootDeviceName="/dev/xvda")["ImageId"]

    def launch(tags: list[dict[str, str]]) -> dict[str, Any]:
        spec = [{"ResourceType": "instance", "Tags": tags}] if tags else []
        kwargs: dict[str, Any] = {"TagSpecifications": spec} if spec else {}
        [instance] = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, **kwargs)["Instances"]
        return instance

    ours = launch([{"Key": MANAGED_TAG, "Value": ""}])
    theirs = launch([])
    # Nodes named by their private DNS name, without providerID; another VPC reuses a name.
    ours_node = ours["PrivateDnsName"]
    same_name = theirs["PrivateDnsName"]
    cluster = [
        objects.namespace("shop"),
        objects.node(ours_node, "spot", zone=f"{REGION}a"),
        objects.node(same_name, "spot", zone=f"{REGION}a"),
    ]
    monkeypatch.setenv("SPOTGUARD_MANAGED_TAG", MANAGED_TAG)
    with testing.running_cluster(cluster) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        queues["sqs"].send_message(QueueUrl=queues["url"], MessageBody=warning(ours["InstanceId"]))
        queues["sqs"].send_message(QueueUrl=queues["url"], MessageBody=warning(theirs["InstanceId"]))
        with caplog.at_level(logging.INFO):
            failures = drain(queues, rounds=3)
        assert all(not f for f in failures)
        wait_for(lambda: interruption_taint(api.get(resources.NODES, ours_node)))
        assert interruption_taint(api.get(resources.NODES, same_name)) is None
    assert count(queues, "url") == 0
    assert count(queues, "dlq_url") == 0
    assert foreign_logged(caplog, theirs["InstanceId"])
