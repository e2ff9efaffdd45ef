"""EventBridge events for EC2 notices, as AWS sends them, decoded into :class:`Notice`.

Three detail-types from source ``aws.ec2`` become notices::

    EC2 Spot Instance Interruption Warning   -> NoticeKind.INTERRUPTION (detail.instance-action)
    EC2 Instance Rebalance Recommendation    -> NoticeKind.REBALANCE
    EC2 Instance State-change Notification   -> NoticeKind.STATE_CHANGE (detail.state)

The instance comes from ``detail.instance-id``, never from ``resources``: the
interruption warning's ARN names the availability zone, not the region and
account (``arn:aws:ec2:us-east-2a:instance/i-...``).

Two error families, both acknowledged and logged, never retried:

- :class:`Malformed`: the payload claims to be one of ours but cannot be read
  (not JSON, a missing ``detail.instance-id``, a time that is not a time);
- :class:`Foreign`: a well-formed payload that is not ours (another source or
  detail-type, another kind of message on a shared queue).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, NotRequired, TypedDict

from spotguard.policy.notices import Notice, NoticeKind

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


def decode(payload: object, what: str = "event") -> Notice:
    """Decode one EventBridge event (already parsed JSON) into a :class:`Notice`.

    Raises :class:`Foreign` for anything that is not one of the three EC2
    detail-types from ``aws.ec2``, and :class:`Malformed` for one of ours that
    cannot be read.
    """
    if not isinstance(payload, Mapping):
        raise Malformed(f"{what} is a JSON {_json_type(payload)}, not an EventBridge event object")
    source = payload.get("source")
    detail_type = payload.get("detail-type")
    raw_id = payload.get("id")
    event_id = raw_id if isinstance(raw_id, str) else ""
    context = {
        "event_id": event_id,
        "source": source if isinstance(source, str) else "",
        "detail_type": detail_type if isinstance(detail_type, str) else "",
    }
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
    if not event_id.strip():
        raise Malformed(f"{detail_type}: 'id' is missing or not a non-empty string", **context)
    time = _time(payload.get("time"), detail_type, context)
    detail = payload.get("detail")
    if not isinstance(detail, Mapping):
        raise Malformed(f"{detail_type} {event_id}: 'detail' is missing or not an object", **context)
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
    region = payload.get("region", "")
    account = payload.get("account", "")
    return Notice(
        event_id=event_id,
        kind=kind,
        instance_id=instance_id,
        time=time,
        state=state,
        action=action,
        region=region if isinstance(region, str) else "",
        account=account if isinstance(account, str) else "",
    )


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
    return {
        "event_id": notice.event_id,
        "kind": notice.kind.value,
        "instance_id": notice.instance_id,
        "time": format_time(notice.time),
        "state": notice.state,
        "action": notice.action,
        "region": notice.region,
        "account": notice.account,
    }


def encode(notice: Notice, *, zone: str = "") -> EventBridgeEvent:
    """The EventBridge event AWS would send for ``notice``: the inverse of :func:`decode`.

    Useful to replay notices and to drive tests and benchmarks. ``resources``
    follows AWS: the interruption warning's ARN names the zone (``zone`` or the
    region), the other two name the region and account.
    """
    region = notice.region or "us-east-1"
    account = notice.account or "123456789012"
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
