"""Decoding EventBridge events into notices: what is read, what is refused, and why."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from spotguard.interruption import events
from spotguard.policy.notices import EVENT_KINDS, Lifecycle, Notice, NoticeKind

from tests.interruption.transport_support import sample

WARNING = "ec2-spot-instance-interruption-warning.json"


def warning(**changes: Any) -> dict[str, Any]:
    event = copy.deepcopy(sample(WARNING))
    for key, value in changes.items():
        if value is None:
            event.pop(key, None)
        else:
            event[key] = value
    return event


def test_the_interruption_warning_reads_detail_instance_id_not_resources() -> None:
    # GIVEN the AWS sample, whose resources ARN names the zone (us-east-2a), not the region
    event = sample(WARNING)
    assert event["resources"] == ["arn:aws:ec2:us-east-2a:instance/i-1234567890abcdef0"]
    # WHEN it is decoded
    notice = events.decode(event)
    # THEN the notice carries detail.instance-id, the action, the event id and a UTC time
    assert notice == Notice(
        event_id="12345678-1234-1234-1234-123456789012",
        kind=NoticeKind.INTERRUPTION,
        instance_id="i-1234567890abcdef0",
        time=datetime(2021, 11, 11, 21, 29, 54, tzinfo=UTC),
        action="terminate",
        region="us-east-2",
        account="123456789012",
    )


def test_detail_instance_id_wins_over_a_different_resource() -> None:
    event = warning(resources=["arn:aws:ec2:us-east-2a:instance/i-00000000000000000"])
    assert events.decode(event).instance_id == "i-1234567890abcdef0"


def test_version_and_account_are_optional() -> None:
    # The state-change sample in the AWS documentation has no "version"; moto's deliveries no "account".
    notice = events.decode(warning(version=None, account=None))
    assert notice.account == ""
    assert notice.kind is NoticeKind.INTERRUPTION


def test_time_with_an_offset_and_fractions_becomes_utc() -> None:
    notice = events.decode(warning(time="2021-11-11T23:29:54.250+02:00"))
    assert notice.time == datetime(2021, 11, 11, 21, 29, 54, 250000, tzinfo=UTC)
    assert notice.time.tzinfo is UTC


def test_an_unknown_instance_action_is_still_an_interruption() -> None:
    # The node goes away whatever EC2 calls it; losing the notice would be worse.
    event = warning(detail={"instance-id": "i-1234567890abcdef0", "instance-action": "reboot"})
    assert events.decode(event).action == "reboot"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": None}, "'id' is missing"),
        ({"id": ""}, "'id' is missing"),
        ({"time": None}, "'time' is missing"),
        ({"time": "yyyy-mm-ddThh:mm:ssZ"}, "is not an RFC 3339 timestamp"),
        ({"time": "2021-11-11T21:29:54"}, "has no time zone"),
        ({"time": 1636666194}, "'time' is missing or not a string"),
        ({"detail": None}, "'detail' is missing or not an object"),
        ({"detail": "i-1234567890abcdef0"}, "'detail' is missing or not an object"),
        ({"detail": {"instance-action": "terminate"}}, "'detail.instance-id' is missing"),
        ({"detail": {"instance-id": 42}}, "'detail.instance-id' is missing or not a string"),
        ({"detail": {"instance-id": "web-1"}}, "is not an EC2 instance id"),
        ({"detail": {"instance-id": "i-1234567890abcdef0", "instance-action": 3}}, "instance-action' is not"),
        ({"source": 7}, "must both be strings (source 7"),
        ({"detail-type": None}, "detail-type None"),
    ],
)
def test_malformed_events_say_what_is_wrong(change: dict[str, Any], message: str) -> None:
    with pytest.raises(events.Malformed) as caught:
        events.decode(warning(**change))
    assert message in str(caught.value)
    assert caught.value.kind == "malformed"


def test_a_state_change_needs_a_known_state() -> None:
    event = sample("ec2-instance-state-change-notification.json")
    event["detail"]["state"] = "exploded"
    with pytest.raises(events.Malformed, match=r"'detail\.state' is 'exploded', not one of pending"):
        events.decode(event)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({**sample(WARNING), "source": "aws.autoscaling"}, "from aws.autoscaling, not 'EC2 Instance-terminate"),
        (sample("autoscaling-lifecycle-launch.json"), "'EC2 Instance-launch Lifecycle Action' from aws.autoscaling"),
        ({**sample(WARNING), "detail-type": "EC2 Instance-terminate Lifecycle Action"}, "not an EC2 notice"),
        (sample("eventbridge-scheduled-event.json"), "from source 'aws.events'"),
        ({"Message": "hello", "Type": "Notification"}, "not an EventBridge event (no 'source' or 'detail-type'"),
    ],
)
def test_events_that_are_not_ours_are_foreign(event: Any, message: str) -> None:
    with pytest.raises(events.Foreign) as caught:
        events.decode(event)
    assert message in str(caught.value)


def test_error_fields_name_the_event_for_the_log() -> None:
    with pytest.raises(events.Foreign) as caught:
        events.decode(sample("autoscaling-lifecycle-launch.json"))
    assert caught.value.fields() == {
        "error": "foreign",
        "reason": (
            "event has detail-type 'EC2 Instance-launch Lifecycle Action' from aws.autoscaling, "
            "not 'EC2 Instance-terminate Lifecycle Action'"
        ),
        "event_id": "12345678-1234-1234-1234-123456789012",
        "source": "aws.autoscaling",
        "detail_type": "EC2 Instance-launch Lifecycle Action",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "body is empty"),
        ("   ", "body is empty"),
        ("Hello from SQS!", "body is not JSON"),
        ('{"detail-type": ', "body is not JSON"),
        ("[1, 2]", "body is a JSON array"),
        ('"text"', "body is a JSON string"),
        ("null", "body is a JSON null"),
        (b"\xff\xfe", "body is not UTF-8 text"),
    ],
)
def test_text_that_is_not_an_event_object_is_malformed(text: str | bytes, message: str) -> None:
    with pytest.raises(events.Malformed, match=message):
        events.decode_json(text, what="body")


def test_decode_json_reads_bytes() -> None:
    text = json.dumps(sample(WARNING)).encode()
    assert events.decode_json(text).instance_id == "i-1234567890abcdef0"


def test_is_eventbridge() -> None:
    assert events.is_eventbridge(sample(WARNING))
    assert not events.is_eventbridge({"Records": []})
    assert not events.is_eventbridge("detail-type")


def test_encode_matches_what_aws_sends() -> None:
    notice = events.decode(sample(WARNING))
    assert events.encode(notice, zone="us-east-2a") == sample(WARNING)


_instance = st.from_regex(r"i-[0-9a-f]{17}", fullmatch=True)
_time = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone(timedelta(hours=3)))
)


@st.composite
def notices(draw: st.DrawFn) -> Notice:
    kind = draw(st.sampled_from(sorted(EVENT_KINDS)))
    time = draw(_time).astimezone(UTC)
    action = draw(st.sampled_from(sorted(events.INSTANCE_ACTIONS))) if kind is NoticeKind.INTERRUPTION else ""
    until = lifecycle = None
    if kind is NoticeKind.LIFECYCLE:
        action = "terminate"
        until = time + timedelta(seconds=events.DEFAULT_LIFECYCLE_SECONDS)
        lifecycle = Lifecycle(draw(st.sampled_from(["web-asg", "eks-spot-1"])), "drain", str(draw(st.uuids())))
    elif kind is NoticeKind.SCHEDULED:
        action = draw(st.sampled_from(["AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "AWS_EC2_INSTANCE_STOP_SCHEDULED"]))
        # AWS Health's times have whole seconds (RFC 1123)
        until = time.replace(microsecond=0) + timedelta(seconds=draw(st.integers(0, 30 * 86400)))
    instance = draw(_instance)
    event_id = str(draw(st.uuids()))
    if kind is NoticeKind.SCHEDULED:
        event_id = f"{event_id}-{instance}"  # one notice per affected instance
    return Notice(
        event_id=event_id,
        kind=kind,
        instance_id=instance,
        time=time,
        state=draw(st.sampled_from(sorted(events.INSTANCE_STATES))) if kind is NoticeKind.STATE_CHANGE else "",
        action=action,
        region=draw(st.sampled_from(["us-east-1", "eu-west-1", "ap-southeast-2"])),
        account=draw(st.from_regex(r"[0-9]{12}", fullmatch=True)),
        until=until,
        lifecycle=lifecycle,
    )


@given(notices())
def test_decode_inverts_encode(notice: Notice) -> None:
    event = events.encode(notice)
    assert events.decode(json.loads(json.dumps(event))) == notice
    assert events.to_json(events.decode(event))["time"].endswith("Z")


def test_a_drain_notice_has_no_eventbridge_event() -> None:
    drain = Notice("drain/od-1/1", NoticeKind.DRAIN, "i-0123456789abcdef0", datetime.now(UTC))
    with pytest.raises(ValueError, match="spotguard's own"):
        events.encode(drain)
