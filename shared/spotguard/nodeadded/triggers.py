"""What starts a reconcile pass, whatever transport delivered it.

==========================================  ==================================================
``dev.knative.apiserver.resource.add``      ApiServerSource (Resource mode): data is the Node
``dev.knative.apiserver.ref.add``           ApiServerSource (Reference mode): data names it
``dev.knative.sources.ping``                PingSource: a scheduled pass
EC2 ``Instance State-change Notification``  state ``running``: a node is joining (others:
                                            acknowledged, nothing to do)
EventBridge ``Scheduled Event``, EventBridge a scheduled pass
Scheduler input ``{"spotguard": ...}``
==========================================  ==================================================

Anything else is :class:`Foreign` (acknowledged, never retried); a payload that
claims to be one of these but cannot be read is :class:`Malformed`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotguard.interruption import events
from spotguard.policy.notices import NoticeKind

NODE_ADDED_TYPES = frozenset({"dev.knative.apiserver.resource.add", "dev.knative.apiserver.ref.add"})
PING = "dev.knative.sources.ping"

Malformed = events.Malformed
Foreign = events.Foreign
TriggerError = events.EventError


class Kind(enum.StrEnum):
    NODE_ADDED = "node-added"  # a Node object was added (Knative ApiServerSource)
    INSTANCE_RUNNING = "instance-running"  # EC2 state change to running (the node may not have joined)
    SCHEDULE = "schedule"  # PingSource, EventBridge schedule, a timer, the command line
    NOTHING = "nothing"  # ours, but asks for nothing (another EC2 state)


@dataclass(frozen=True)
class Trigger:
    kind: Kind
    id: str = ""
    node: str = ""  # NODE_ADDED
    instance_id: str = ""  # INSTANCE_RUNNING
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"kind": str(self.kind), "id": self.id}
        if self.node:
            out["node"] = self.node
        if self.instance_id:
            out["instance_id"] = self.instance_id
        if self.detail:
            out["detail"] = self.detail
        return out


def is_schedule(event: object) -> bool:
    """An EventBridge rule schedule, or an EventBridge Scheduler input for spotguard."""
    if not isinstance(event, Mapping):
        return False
    if "spotguard" in event:
        return True
    if event.get("source") == "aws.events" and event.get("detail-type") == "Scheduled Event":
        return True
    return event.get("source") == "aws.scheduler"


def from_node(data: object, event_id: str, what: str) -> Trigger:
    """An ApiServerSource event's data: the Node (Resource mode) or a reference to it."""
    if not isinstance(data, Mapping):
        raise Malformed(f"{what} is not a JSON object")
    kind = data.get("kind")
    if kind != "Node":
        raise Foreign(f"{what} is a {kind or 'object without kind'}, not a Node")
    name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), Mapping) else None
    name = name or data.get("name")
    if not isinstance(name, str) or not name:
        raise Malformed(f"{what} is a Node without a name")
    return Trigger(Kind.NODE_ADDED, event_id, node=name)


def from_eventbridge(event: Mapping[str, Any], what: str) -> Trigger:
    """An EventBridge event: a schedule, or an EC2 state change."""
    if is_schedule(event):
        return Trigger(Kind.SCHEDULE, str(event.get("id") or event.get("executionId") or ""), detail="schedule")
    notice = events.decode(event, what)
    if notice.kind is not NoticeKind.STATE_CHANGE:
        raise Foreign(f"{what} is a {notice.kind} notice: the spot-interruption function's, not this one's")
    if notice.state != "running":
        return Trigger(
            Kind.NOTHING, notice.event_id, instance_id=notice.instance_id, detail=f"instance state {notice.state}"
        )
    return Trigger(Kind.INSTANCE_RUNNING, notice.event_id, instance_id=notice.instance_id)


def from_cloudevent(ce_type: str, event_id: str, data: object) -> Trigger:
    what = f"CloudEvent {event_id} ({ce_type}) data"
    if ce_type == PING:
        return Trigger(Kind.SCHEDULE, event_id, detail="ping")
    if isinstance(data, str | bytes | bytearray):
        data = events.parse_json(data, what)
    if ce_type in NODE_ADDED_TYPES:
        return from_node(data, event_id, what)
    if isinstance(data, Mapping) and (events.is_eventbridge(data) or is_schedule(data)):
        return from_eventbridge(data, what)
    raise Foreign(f"CloudEvent type {ce_type!r} is not one this function handles")
