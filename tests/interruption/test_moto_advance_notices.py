"""Advance notices aws-node-termination-handler handles: ASG terminate lifecycle hooks and
AWS Health scheduled changes, through SQS (moto in server mode) into the handler and the
simulated cluster.

GIVEN an Auto Scaling group with a terminate lifecycle hook (heartbeat timeout 300 s) in
moto, a spot node of that group running both replicas of a Deployment, and an on-demand
node
WHEN the group's ``EC2 Instance-terminate Lifecycle Action`` arrives through the queue and
the reconcile runs
THEN the node is tainted with a mark holding the lifecycle action and the hook's global
timeout as its reclaim time, the action gets a heartbeat while the surge is not Ready, and
it is completed (CONTINUE) only once the replacements are Ready on the node that stays.

GIVEN an AWS Health scheduled change (instance retirement) naming that instance and
another cluster's
WHEN it arrives through the queue
THEN the message is acknowledged, the node is tainted with the event's start time as its
reclaim time and its Deployment surges; the other instance changes nothing.

moto answers DescribeLifecycleHooks but implements neither RecordLifecycleActionHeartbeat
nor CompleteLifecycleAction: those two calls are recorded by a thin client that passes
everything else to moto.
"""

from __future__ import annotations

import email.utils
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from spotguard.gateway import kube, resources
from spotguard.interruption import handler as handler_mod
from spotguard.interruption import sqs
from spotguard.policy import config
from spotguard.policy.notices import NODE_NOTICE, NodeNotice
from spotguard_sim import objects, testing

from tests.interruption.transport_support import (
    NTH_INSTANCE,
    SPOT_INSTANCE,
    Moto,
    assert_copy_surge,
    interruption_taint,
    lambda_batch,
    node,
    sample,
    unique,
    wait_for,
)


class LifecycleCalls:
    """moto's Auto Scaling client, with the two lifecycle action calls moto lacks recorded."""

    def __init__(self, client: Any, probe: Any) -> None:
        self.client = client
        self.probe = probe  # what the cluster shows when a call is made
        self.calls: list[tuple[str, dict[str, Any], int]] = []

    def describe_lifecycle_hooks(self, **kwargs: Any) -> Any:
        return self.client.describe_lifecycle_hooks(**kwargs)

    def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> None:
        self.calls.append(("heartbeat", kwargs, self.probe()))

    def complete_lifecycle_action(self, **kwargs: Any) -> None:
        self.calls.append(("complete", kwargs, self.probe()))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, kube.Kube]]:
    """Both replicas of web on spot-a; then an on-demand node for the replacements."""
    scenario = [
        objects.namespace("shop"),
        objects.namespace("spotguard"),
        node("spot-a", "spot", SPOT_INSTANCE),
        objects.deployment("web", 2, namespace="shop"),
    ]
    with testing.running_cluster(scenario) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.Kube(sim.api_client())
        wait_for(lambda: ready_on(api, "spot-a") == 2, timeout=20)
        api.create(resources.NODES, node("od-a", "on-demand", "i-0aaaaaaaaaaaaaaa1"))
        yield sim, api


@pytest.fixture
def queue(aws_env: Moto) -> dict[str, Any]:
    sqs_client = aws_env.client("sqs")
    url = sqs_client.create_queue(QueueName=unique("notices"))["QueueUrl"]
    arn = sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return {"sqs": sqs_client, "url": url, "arn": arn}


def ready_on(api: kube.Kube, node_name: str, copy_of: str = "") -> int:
    """Ready pods on ``node_name`` (only those of ``copy_of``'s surge copy, where given)."""
    return sum(
        1
        for p in api.list(resources.PODS, "shop")
        if p["spec"].get("nodeName") == node_name
        and not p["metadata"].get("deletionTimestamp")
        and (not copy_of or p["metadata"].get("labels", {}).get("spotguard.io/surge-of") == copy_of)
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions") or [])
    )


def through_the_queue(queue: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """The event as the EventBridge rule puts it on the queue, received as Lambda receives it."""
    queue["sqs"].send_message(QueueUrl=queue["url"], MessageBody=json.dumps(event))
    got = queue["sqs"].receive_message(QueueUrl=queue["url"], MaxNumberOfMessages=10, AttributeNames=["All"])
    return lambda_batch(got["Messages"], queue["arn"])


def mark(api: kube.Kube, name: str) -> NodeNotice:
    parsed = NodeNotice.parse(api.get(resources.NODES, name)["metadata"].get("annotations", {}).get(NODE_NOTICE))
    assert parsed is not None, f"{name} has no notice recorded"
    return parsed


def test_a_lifecycle_hook_is_held_until_the_surge_is_ready_then_completed(
    aws_env: Moto, cluster: tuple[Any, kube.Kube], queue: dict[str, Any]
) -> None:
    sim, api = cluster
    autoscaling = aws_env.client("autoscaling")
    group = unique("spot-nodes")
    autoscaling.create_launch_configuration(
        LaunchConfigurationName=group, ImageId="ami-12c6146b", InstanceType="m5.large"
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=group,
        LaunchConfigurationName=group,
        MinSize=0,
        MaxSize=2,
        AvailabilityZones=["us-east-2a"],
    )
    autoscaling.put_lifecycle_hook(
        AutoScalingGroupName=group,
        LifecycleHookName="spotguard",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=300,
        DefaultResult="CONTINUE",
    )
    # The surge is web's copy (the default): its pods on the node that stays are what the hook waits for.
    calls = LifecycleCalls(autoscaling, probe=lambda: ready_on(api, "od-a", copy_of="web"))
    handler = handler_mod.Handler(api, config.Config(), clock=sim.clock.now, autoscaling=calls)
    token = str(uuid.uuid4())
    now = datetime.now(UTC).replace(microsecond=0)
    event = {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "source": "aws.autoscaling",
        "account": "123456789012",
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-east-2",
        "resources": [
            f"arn:aws:autoscaling:us-east-2:123456789012:autoScalingGroup:{uuid.uuid4()}:autoScalingGroupName/{group}"
        ],
        "detail": {
            "LifecycleActionToken": token,
            "AutoScalingGroupName": group,
            "LifecycleHookName": "spotguard",
            "EC2InstanceId": SPOT_INSTANCE,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        },
    }
    answer = sqs.handle_batch(through_the_queue(queue, event), handler)
    assert answer == {"batchItemFailures": []}
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == event["id"]
    recorded = mark(api, "spot-a")
    assert recorded.lifecycle is not None and recorded.lifecycle.token == token
    # the hook's global timeout: 100 heartbeat timeouts (at most 48 hours)
    assert recorded.until - recorded.time == pytest.approx(100 * 300)
    # the surge: web's copy of two, web's own count untouched
    assert_copy_surge(api, "web", 2, 2)
    # held while the surge is not Ready
    assert [name for name, _, _ in calls.calls] == ["heartbeat"]

    def completed() -> bool:
        handler.reconcile()
        return any(name == "complete" for name, _, _ in calls.calls)

    wait_for(completed, timeout=40, interval=0.2)
    [(_, kwargs, ready_then)] = [c for c in calls.calls if c[0] == "complete"]
    assert kwargs == {
        "AutoScalingGroupName": group,
        "LifecycleHookName": "spotguard",
        "LifecycleActionToken": token,
        "InstanceId": SPOT_INSTANCE,
        "LifecycleActionResult": "CONTINUE",
    }
    assert ready_then >= 2, "completed before the copy's replacements were Ready"
    assert api.get(resources.DEPLOYMENTS, "web", "shop")["spec"]["replicas"] == 2
    # one heartbeat per half heartbeat timeout at most, and one completion
    assert [name for name, _, _ in calls.calls] == ["heartbeat", "complete"]
    handler.reconcile()
    assert [name for name, _, _ in calls.calls] == ["heartbeat", "complete"]


def test_an_aws_health_scheduled_change_dooms_the_node_at_its_start_time(
    aws_env: Moto, cluster: tuple[Any, kube.Kube], queue: dict[str, Any]
) -> None:
    sim, api = cluster
    handler = handler_mod.Handler(api, config.Config(), clock=sim.clock.now)
    event = sample("aws-health-scheduled-change.json")
    now = datetime.now(UTC).replace(microsecond=0)
    start = now + timedelta(days=3)
    event["id"] = str(uuid.uuid4())
    event["time"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    event["detail"]["startTime"] = email.utils.format_datetime(start, usegmt=True)
    assert {e["entityValue"] for e in event["detail"]["affectedEntities"]} == {SPOT_INSTANCE, NTH_INSTANCE}
    answer = sqs.handle_batch(through_the_queue(queue, event), handler)
    assert answer == {"batchItemFailures": []}
    assert interruption_taint(api.get(resources.NODES, "spot-a")) == f"{event['id']}-{SPOT_INSTANCE}"
    recorded = mark(api, "spot-a")
    assert str(recorded.kind) == "scheduled-change"
    assert recorded.until == pytest.approx(start.timestamp())
    # the surge starts now, days before the retirement: web's copy, on the node that stays
    assert_copy_surge(api, "web", 2, 2)
    wait_for(lambda: ready_on(api, "od-a", copy_of="web") >= 2, timeout=30)
    assert interruption_taint(api.get(resources.NODES, "od-a")) is None
