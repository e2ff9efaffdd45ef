"""What each real sample starts in the node-added function (tests/events), decoded as its transport does."""

from __future__ import annotations

import pytest
from spotguard.interruption import cloudevents as interruption_ce
from spotguard.nodeadded import triggers
from spotguard.nodeadded.triggers import Kind

from tests.interruption.transport_support import sample

CLOUDEVENTS = {
    "cloudevent-apiserversource-node.binary.json": (Kind.NODE_ADDED, "ip-10-0-1-23.ec2.internal"),
    "cloudevent-apiserversource-node.structured.json": (Kind.NODE_ADDED, "ip-10-0-1-23.ec2.internal"),
    "cloudevent-foreign.binary.json": (Kind.NODE_ADDED, "ip-10-0-1-23.ec2.internal"),
    "cloudevent-ping.binary.json": (Kind.SCHEDULE, ""),
    "cloudevent-ping.structured.json": (Kind.SCHEDULE, ""),
}
LAMBDA = {
    "ec2-instance-state-change-notification.running.json": Kind.INSTANCE_RUNNING,
    "ec2-instance-state-change-notification.json": Kind.NOTHING,
    "ec2-instance-state-change-notification.shutting-down.json": Kind.NOTHING,
    "eventbridge-scheduled-event.json": Kind.SCHEDULE,
    "eventbridge-scheduler-input.json": Kind.SCHEDULE,
}


@pytest.mark.parametrize("name", sorted(CLOUDEVENTS))
def test_cloudevents(name: str) -> None:
    payload = sample(name)
    event = interruption_ce.decode_http(payload["headers"], payload["body"].encode())
    got = triggers.from_cloudevent(event.get_type(), event.get_id(), event.get_data())
    assert (got.kind, got.node) == CLOUDEVENTS[name]
    assert got.id == event.get_id()


@pytest.mark.parametrize("name", sorted(LAMBDA))
def test_lambda_events(name: str) -> None:
    got = triggers.from_eventbridge(sample(name), name)
    assert got.kind is LAMBDA[name]
    if got.kind is Kind.INSTANCE_RUNNING:
        assert got.instance_id == "i-1234567890abcdef0"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("ec2-spot-instance-interruption-warning.json", triggers.Foreign),
        ("ec2-instance-rebalance-recommendation.json", triggers.Foreign),
        ("autoscaling-lifecycle-terminate.json", triggers.Foreign),
        ("ec2-spot-instance-interruption-warning.as-documented.json", triggers.Malformed),
    ],
)
def test_not_ours(name: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        triggers.from_eventbridge(sample(name), name)


@pytest.mark.parametrize(
    ("ce_type", "data", "error"),
    [
        ("dev.knative.apiserver.resource.add", {"kind": "Pod", "metadata": {"name": "x"}}, triggers.Foreign),
        ("dev.knative.apiserver.resource.add", {"kind": "Node", "metadata": {}}, triggers.Malformed),
        ("dev.knative.apiserver.resource.add", b"not json", triggers.Malformed),
        ("dev.knative.apiserver.resource.add", ["a list"], triggers.Malformed),
        ("com.example.other", {"hello": 1}, triggers.Foreign),
    ],
)
def test_bad_cloudevents(ce_type: str, data: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        triggers.from_cloudevent(ce_type, "id-1", data)


def test_a_reference_mode_event_names_the_node() -> None:
    got = triggers.from_cloudevent(
        "dev.knative.apiserver.ref.add", "id-2", {"kind": "Node", "name": "n1", "apiVersion": "v1"}
    )
    assert (got.kind, got.node) == (Kind.NODE_ADDED, "n1")
