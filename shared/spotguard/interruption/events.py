"""EventBridge events for EC2 notices, as AWS sends them, decoded into :class:`Notice`.

Three detail-types from source ``aws.ec2`` become notices::

    EC2 Spot Instance Interruption Warning   -> NoticeKind.INTERRUPTION (detail.instance-action)
    EC2 Instance Rebalance Recommendation    -> NoticeKind.REBALANCE
    EC2 Instance State-change Notification   -> NoticeKind.STATE_CHANGE (detail.state)

The instance comes from ``detail.instance-id``, never from ``resources``: the
interruption warning's ARN names the availability zone, not the region and
account (``arn:aws:ec2:us-east-2a:instance/i-...``).

Two more are advance notices, as aws-node-termination-handler handles them
(its ``pkg/monitor/sqsevent``), each with its reclaim time (``Notice.until``)::

    aws.autoscaling  EC2 Instance-terminate Lifecycle Action -> NoticeKind.LIFECYCLE
        (detail.EC2InstanceId; the lifecycle action to heartbeat and complete:
        AutoScalingGroupName, LifecycleHookName, LifecycleActionToken; the reclaim
        time is the hook's global timeout, which the handler reads from the group)
    aws.health       AWS Health Event, service EC2, category scheduledChange
                     -> NoticeKind.SCHEDULED, one per affected instance
        (detail.affectedEntities[].entityValue; the reclaim time is detail.startTime)

Use :func:`decode_all` where a payload may hold several notices (a Health event
names every affected instance); :func:`decode` takes its first.

Two error families, both acknowledged and logged, never retried:

- :class:`Malformed`: the payload claims to be one of ours but cannot be read
  (not JSON, a missing ``detail.instance-id``, a time that is not a time);
- :class:`Foreign`: a well-formed payload that is not ours (another source or
  detail-type, another kind of message on a shared queue).
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal, NotRequired, TypedDict

from spotguard.policy.notices import EVENT_KINDS, Lifecycle, Notice, NoticeKind

SOURCE = "aws.ec2"
INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"

DETAIL_TYPES: Mapping[str, NoticeKind] = {
    INTERRUPTION_WARNING: NoticeKind.INTERRUPTION,
    REBALANCE_RECOMMENDATION: NoticeKind.REBALANCE,
    STATE_CHANGE: NoticeKind.STATE_CHANGE,
}
DETAIL_TYPE_OF: Mapping[NoticeKind, str] = {kind: name for name, kind in DETAIL_TYPES.items()}

AUTOSCALING = "aws.autoscaling"
LIFECYCLE_ACTION = "EC2 Instance-terminate Lifecycle Action"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
HEALTH = "aws.health"
HEALTH_EVENT = "AWS Health Event"
# A lifecycle hook's global timeout, until the handler reads the hook's own: 100 x the
# default heartbeat timeout (3600 s), at most 48 hours (Auto Scaling's limits).
DEFAULT_LIFECYCLE_SECONDS = 172800.0

InstanceAction = Literal["terminate", "stop", "hibernate"]
InstanceState = Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]
INSTANCE_ACTIONS: frozenset[str] = frozenset({"terminate", "stop", "hibernate"})
INSTANCE_STATES: frozenset[str] = frozenset(
    {"pending", "running", "stopping", "stopped", "shutting-down", "terminated"}
)

# i-1234567890abcdef0 (17 hex digits) or the older i-12345678; the simulated
# cluster and other tools use other lower-case alphanumerics, so be tolerant.
_INSTANCE_ID = re.compile(r"i-[0-9a-z]{1,64}")

# The detail of each detail-type, as AWS documents it (keys with dashes, so the
# functional TypedDict form).
SpotInterruptionDetail = TypedDict("SpotInterruptionDetail", {"instance-id": str, "instance-action": InstanceAction})
RebalanceDetail = TypedDict("RebalanceDetail", {"instance-id": str})
StateChangeDetail = TypedDict("StateChangeDetail", {"instance-id": str, "state": InstanceState})

EventBridgeEvent = TypedDict(
    "EventBridgeEvent",
    {
        # "version" and "account" are missing from some samples AWS publishes and
        # from moto's deliveries; nothing here depends on them.
        "version": NotRequired[str],
        "id": str,
        "detail-type": str,
        "source": str,
        "account": NotRequired[str],
        "time": str,
        "region": NotRequired[str],
        "resources": NotRequired[list[str]],
        "detail": SpotInterruptionDetail | RebalanceDetail | StateChangeDetail,
    },
)


class EventError(ValueError):
    """A payload that will never become a notice. Acknowledge it, log it, never retry it."""

    kind: ClassVar[str] = "error"

    def __init__(self, message: str, *, event_id: str = "", source: str = "", detail_type: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.event_id = event_id
        self.source = source
        self.detail_type = detail_type

    def fields(self) -> dict[str, str]:
        """Structured-log fields describing the payload."""
        out = {"error": self.kind, "reason": self.message}
        if self.event_id:
            out["event_id"] = self.event_id
        if self.source:
            out["source"] = self.source
        if self.detail_type:
            out["detail_type"] = self.detail_type
        return out


class Malformed(EventError):
    """The payload cannot be read as what it claims to be."""

    kind = "malformed"


class Foreign(EventError):
    """A readable payload that is not an EC2 notice for this function."""

    kind = "foreign"


def parse_json(text: str | bytes | bytearray, what: str) -> Any:
    """``json.loads`` with a :class:`Malformed` naming ``what`` on failure."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Malformed(f"{what} is not UTF-8 text: {exc}") from None
    if not text.strip():
        raise Malformed(f"{what} is empty")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # too deep, or an integer of over 4300 digits
        raise Malformed(f"{what} is not JSON: {str(exc)[:200]}") from None


def is_eventbridge(payload: object) -> bool:
    """True for anything shaped like an EventBridge event (an object with ``detail-type``)."""
    return isinstance(payload, Mapping) and "detail-type" in payload


def decode_json(text: str | bytes | bytearray, what: str = "message body") -> Notice:
    """Decode the JSON text of an EventBridge event (an SQS message body, say)."""
    return decode(parse_json(text, what), what)


def decode_json_all(text: str | bytes | bytearray, what: str = "message body") -> list[Notice]:
    """:func:`decode_json`, every notice of the event (:func:`decode_all`)."""
    return decode_all(parse_json(text, what), what)


def decode(payload: object, what: str = "event") -> Notice:
    """Decode one EventBridge event (already parsed JSON) into a :class:`Notice` (the
    first, for a Health event naming several instances: see :func:`decode_all`)."""
    return decode_all(payload, what)[0]


def decode_all(payload: object, what: str = "event") -> list[Notice]:
    """Decode one EventBridge event (already parsed JSON) into its notices (at least one).

    Raises :class:`Foreign` for anything that is not one of the detail-types above,
    and :class:`Malformed` for one of ours that cannot be read.
    """
    if isinstance(payload, Mapping) and payload.get("source") in (AUTOSCALING, HEALTH):
        return _advance(payload, what)
    return [_decode_ec2(payload, what)]


def _decode_ec2(payload: object, what: str) -> Notice:
    if not isinstance(payload, Mapping):
        raise Malformed(f"{what} is a JSON {_json_type(payload)}, not an EventBridge event object")
    source = payload.get("source")
    detail_type = payload.get("detail-type")
    event_id, context = _identity(payload)
    if detail_type is None and source is None:
        keys = ", ".join(sorted(str(k) for k in payload)[:8]) or "none"
        raise Foreign(
            f"{what} is not an EventBridge event (no 'source' or 'detail-type'; keys: {keys})",
            **context,
        )
    if not isinstance(source, str) or not isinstance(detail_type, str):
        raise Malformed(
            f"{what}: 'source' and 'detail-type' must both be strings (source {source!r}, detail-type {detail_type!r})",
            **context,
        )
    if source != SOURCE:
        raise Foreign(f"{what} is from source {source!r}, not {SOURCE!r}", **context)
    kind = DETAIL_TYPES.get(detail_type)
    if kind is None:
        raise Foreign(f"{what} has detail-type {detail_type!r}, not an EC2 notice", **context)
    time, detail = _envelope(payload, detail_type, event_id, context)
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id:
        raise Malformed(f"{detail_type} {event_id}: 'detail.instance-id' is missing or not a string", **context)
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise Malformed(
            f"{detail_type} {event_id}: 'detail.instance-id' {instance_id!r} is not an EC2 instance id",
            **context,
        )
    action = ""
    state = ""
    if kind is NoticeKind.INTERRUPTION:
        # AWS sends terminate, stop or hibernate. An action we do not know is
        # still an interruption (the node goes away either way): keep it.
        raw_action = detail.get("instance-action", "")
        if not isinstance(raw_action, str):
            raise Malformed(f"{detail_type} {event_id}: 'detail.instance-action' is not a string", **context)
        action = raw_action
    elif kind is NoticeKind.STATE_CHANGE:
        raw_state = detail.get("state")
        if not isinstance(raw_state, str) or raw_state not in INSTANCE_STATES:
            raise Malformed(
                f"{detail_type} {event_id}: 'detail.state' is {raw_state!r}, "
                f"not one of {', '.join(sorted(INSTANCE_STATES))}",
                **context,
            )
        state = raw_state
    region, account = _origin(payload)
    return Notice(
        event_id=event_id,
        kind=kind,
        instance_id=instance_id,
        time=time,
        state=state,
        action=action,
        region=region,
        account=account,
    )


def _identity(payload: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The event's id (``""`` where it is not a string) and the context its errors carry."""
    source = payload.get("source")
    detail_type = payload.get("detail-type")
    raw_id = payload.get("id")
    event_id = raw_id if isinstance(raw_id, str) else ""
    return event_id, {
        "event_id": event_id,
        "source": source if isinstance(source, str) else "",
        "detail_type": detail_type if isinstance(detail_type, str) else "",
    }


def _origin(payload: Mapping[str, Any]) -> tuple[str, str]:
    """The event's region and account (``""`` where they are not strings)."""
    region = payload.get("region", "")
    account = payload.get("account", "")
    return (region if isinstance(region, str) else "", account if isinstance(account, str) else "")


def _envelope(
    payload: Mapping[str, Any], name: str, event_id: str, context: Mapping[str, str]
) -> tuple[datetime, Mapping[str, Any]]:
    """The event's time and detail, once its id is known to be there."""
    if not event_id.strip():
        raise Malformed(f"{name}: 'id' is missing or not a non-empty string", **context)
    time = _time(payload.get("time"), name, context)
    detail = payload.get("detail")
    if not isinstance(detail, Mapping):
        raise Malformed(f"{name} {event_id}: 'detail' is missing or not an object", **context)
    return time, detail


def _advance(payload: Mapping[str, Any], what: str) -> list[Notice]:
    """An ASG lifecycle action or an AWS Health scheduled change (see the module docstring)."""
    source = str(payload.get("source"))
    detail_type = payload.get("detail-type")
    event_id, context = _identity(payload)
    wanted = LIFECYCLE_ACTION if source == AUTOSCALING else HEALTH_EVENT
    if detail_type != wanted:
        raise Foreign(f"{what} has detail-type {detail_type!r} from {source}, not {wanted!r}", **context)
    time, detail = _envelope(payload, wanted, event_id, context)
    region, account = _origin(payload)
    common = {"event_id": event_id, "time": time, "region": region, "account": account}
    if source == AUTOSCALING:
        return [_lifecycle(detail, common, context)]
    return _scheduled_change(detail, common, context)


def _lifecycle(detail: Mapping[str, Any], common: dict[str, Any], context: Mapping[str, str]) -> Notice:
    event_id = common["event_id"]
    if detail.get("Event") == "autoscaling:TEST_NOTIFICATION":
        raise Foreign(f"{LIFECYCLE_ACTION} {event_id} is Auto Scaling's test notification", **context)
    transition = detail.get("LifecycleTransition")
    if transition != TERMINATING:
        raise Foreign(f"{LIFECYCLE_ACTION} {event_id}: transition {transition!r}, not {TERMINATING}", **context)
    fields = {}
    for key in ("EC2InstanceId", "AutoScalingGroupName", "LifecycleHookName", "LifecycleActionToken"):
        value = detail.get(key)
        if not isinstance(value, str) or not value:
            raise Malformed(f"{LIFECYCLE_ACTION} {event_id}: 'detail.{key}' is missing or not a string", **context)
        fields[key] = value
    instance_id = fields["EC2InstanceId"]
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise Malformed(f"{LIFECYCLE_ACTION} {event_id}: {instance_id!r} is not an EC2 instance id", **context)
    time: datetime = common["time"]
    try:
        until = time + timedelta(seconds=DEFAULT_LIFECYCLE_SECONDS)
    except OverflowError:
        raise Malformed(f"{LIFECYCLE_ACTION} {event_id}: 'time' is too far in the future", **context) from None
    return Notice(
        kind=NoticeKind.LIFECYCLE,
        instance_id=instance_id,
        until=until,
        lifecycle=Lifecycle(
            group=fields["AutoScalingGroupName"],
            hook=fields["LifecycleHookName"],
            token=fields["LifecycleActionToken"],
        ),
        action="terminate",
        **common,
    )


def _scheduled_change(detail: Mapping[str, Any], common: dict[str, Any], context: Mapping[str, str]) -> list[Notice]:
    event_id = common["event_id"]
    service = detail.get("service")
    category = detail.get("eventTypeCategory")
    if service != "EC2" or category != "scheduledChange":
        raise Foreign(
            f"{HEALTH_EVENT} {event_id}: service {service!r}, category {category!r}; not an EC2 scheduledChange",
            **context,
        )
    if detail.get("statusCode") == "closed":
        raise Foreign(f"{HEALTH_EVENT} {event_id}: the scheduled change is closed (done or cancelled)", **context)
    start = detail.get("startTime")
    until = _health_time(start)
    if until is None:
        raise Malformed(f"{HEALTH_EVENT} {event_id}: 'detail.startTime' {start!r} is not a time", **context)
    entities = detail.get("affectedEntities")
    if not isinstance(entities, list):
        raise Malformed(f"{HEALTH_EVENT} {event_id}: 'detail.affectedEntities' is not a list", **context)
    ids = [e.get("entityValue") for e in entities if isinstance(e, Mapping)]
    instances = sorted({i for i in ids if isinstance(i, str) and _INSTANCE_ID.fullmatch(i)})
    if not instances:
        raise Foreign(f"{HEALTH_EVENT} {event_id}: no EC2 instance among its affected entities", **context)
    code = detail.get("eventTypeCode")
    # One notice per instance, each with an id of its own (a node's taint names it; a retry
    # is remembered by it): the event's id and the instance's.
    return [
        Notice(
            kind=NoticeKind.SCHEDULED,
            instance_id=instance,
            until=until,
            action=code if isinstance(code, str) else "",
            **{**common, "event_id": f"{event_id}-{instance}"},
        )
        for instance in instances
    ]


def _health_time(raw: object) -> datetime | None:
    """AWS Health's times: ``Sat, 05 Jun 2016 15:10:09 GMT`` (RFC 1123), or RFC 3339."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def _time(raw: object, detail_type: str, context: Mapping[str, str]) -> datetime:
    event_id = context.get("event_id", "")
    if not isinstance(raw, str) or not raw:
        raise Malformed(f"{detail_type} {event_id}: 'time' is missing or not a string", **context)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise Malformed(
            f"{detail_type} {event_id}: 'time' {raw!r} is not an RFC 3339 timestamp (like 2021-11-11T21:29:54Z)",
            **context,
        ) from None
    if parsed.tzinfo is None:
        raise Malformed(f"{detail_type} {event_id}: 'time' {raw!r} has no time zone", **context)
    return parsed.astimezone(UTC)


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def format_time(value: datetime) -> str:
    """EventBridge's time format: ``2021-11-11T21:29:54Z`` (fractions kept when present)."""
    text = value.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def to_json(notice: Notice) -> dict[str, str]:
    """A notice as plain JSON (golden files, HTTP answers, logs)."""
    out = {
        "event_id": notice.event_id,
        "kind": notice.kind.value,
        "instance_id": notice.instance_id,
        "time": format_time(notice.time),
        "state": notice.state,
        "action": notice.action,
        "region": notice.region,
        "account": notice.account,
    }
    if notice.until is not None:
        out["until"] = format_time(notice.until)
    if notice.lifecycle is not None:
        out["auto_scaling_group"] = notice.lifecycle.group
        out["lifecycle_hook"] = notice.lifecycle.hook
        out["lifecycle_action_token"] = notice.lifecycle.token
    return out


def encode(notice: Notice, *, zone: str = "") -> EventBridgeEvent:
    """The EventBridge event AWS would send for ``notice``: the inverse of :func:`decode`.

    Useful to replay notices and to drive tests and benchmarks. ``resources``
    follows AWS: the interruption warning's ARN names the zone (``zone`` or the
    region), the other two name the region and account.
    """
    if notice.kind not in EVENT_KINDS:
        raise ValueError(f"a {notice.kind} notice is spotguard's own: AWS sends no event for it")
    region = notice.region or "us-east-1"
    account = notice.account or "123456789012"
    if notice.kind in (NoticeKind.LIFECYCLE, NoticeKind.SCHEDULED):
        return _encode_advance(notice, region, account)  # type: ignore[return-value]
    detail: SpotInterruptionDetail | RebalanceDetail | StateChangeDetail
    if notice.kind is NoticeKind.INTERRUPTION:
        detail = {"instance-id": notice.instance_id, "instance-action": notice.action or "terminate"}  # type: ignore[typeddict-item]
        resource = f"arn:aws:ec2:{zone or region}:instance/{notice.instance_id}"
    elif notice.kind is NoticeKind.STATE_CHANGE:
        detail = {"instance-id": notice.instance_id, "state": notice.state}  # type: ignore[typeddict-item]
        resource = f"arn:aws:ec2:{region}:{account}:instance/{notice.instance_id}"
    else:
        detail = {"instance-id": notice.instance_id}
        resource = f"arn:aws:ec2:{region}:{account}:instance/{notice.instance_id}"
    event: EventBridgeEvent = {
        "version": "0",
        "id": notice.event_id,
        "detail-type": DETAIL_TYPE_OF[notice.kind],
        "source": SOURCE,
        "account": account,
        "time": format_time(notice.time),
        "region": region,
        "resources": [resource],
        "detail": detail,
    }
    return event


def _encode_advance(notice: Notice, region: str, account: str) -> dict[str, Any]:
    """The ASG lifecycle action or AWS Health event AWS would send (see :func:`encode`)."""
    if notice.kind is NoticeKind.LIFECYCLE:
        life = notice.lifecycle or Lifecycle("spotguard-group", "spotguard-hook", notice.event_id)
        group_arn = (
            f"arn:aws:autoscaling:{region}:{account}:autoScalingGroup:"
            f"00000000-0000-0000-0000-000000000000:autoScalingGroupName/{life.group}"
        )
        return {
            "version": "0",
            "id": notice.event_id,
            "detail-type": LIFECYCLE_ACTION,
            "source": AUTOSCALING,
            "account": account,
            "time": format_time(notice.time),
            "region": region,
            "resources": [group_arn],
            "detail": {
                "LifecycleActionToken": life.token,
                "AutoScalingGroupName": life.group,
                "LifecycleHookName": life.hook,
                "EC2InstanceId": notice.instance_id,
                "LifecycleTransition": TERMINATING,
            },
        }
    start = notice.until or notice.time
    code = notice.action or "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED"
    return {
        "version": "0",
        "id": notice.event_id.removesuffix(f"-{notice.instance_id}"),
        "detail-type": HEALTH_EVENT,
        "source": HEALTH,
        "account": account,
        "time": format_time(notice.time),
        "region": region,
        "resources": [notice.instance_id],
        "detail": {
            "eventArn": f"arn:aws:health:{region}::event/EC2/{code}/{notice.event_id}",
            "service": "EC2",
            "eventTypeCode": code,
            "eventTypeCategory": "scheduledChange",
            "startTime": email.utils.format_datetime(start.astimezone(UTC), usegmt=True),
            "eventDescription": [{"language": "en_US", "latestDescription": "scheduled change"}],
            "affectedEntities": [{"entityValue": notice.instance_id}],
        },
    }
