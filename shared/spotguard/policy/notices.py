"""EC2 notices as the policy sees them, whatever transport delivered them."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime


class NoticeKind(enum.StrEnum):
    INTERRUPTION = "interruption"  # EC2 Spot Instance Interruption Warning
    REBALANCE = "rebalance"  # EC2 Instance Rebalance Recommendation
    STATE_CHANGE = "state-change"  # EC2 Instance State-change Notification
    LIFECYCLE = "lifecycle"  # EC2 Instance-terminate Lifecycle Action (an ASG lifecycle hook)
    SCHEDULED = "scheduled-change"  # AWS Health Event: an EC2 scheduled change (retirement, maintenance)
    # Not EC2's: a node autoscaler drains a node that is not spot (spotguard.policy.drains)
    DRAIN = "drain"


# Kinds AWS sends (EventBridge): a drain is spotguard's own, found in the cluster.
EVENT_KINDS = frozenset(NoticeKind) - {NoticeKind.DRAIN}
# Kinds whose reclaim time the notice itself says (Notice.until), not a fixed window.
ADVANCE_KINDS = frozenset({NoticeKind.LIFECYCLE, NoticeKind.SCHEDULED, NoticeKind.DRAIN})


@dataclass(frozen=True)
class Lifecycle:
    """The ASG lifecycle action a terminate notice holds open: heartbeats keep the instance
    until the surge is Ready, then CompleteLifecycleAction lets the group terminate it."""

    group: str  # AutoScalingGroupName
    hook: str  # LifecycleHookName
    token: str  # LifecycleActionToken


@dataclass(frozen=True)
class Notice:
    event_id: str  # the EventBridge event's "id"
    kind: NoticeKind
    instance_id: str  # detail.instance-id
    time: datetime  # the event's "time", timezone-aware UTC
    state: str = ""  # state-change only: pending, running, shutting-down, terminated, ...
    action: str = ""  # interruption only: terminate, stop or hibernate
    region: str = ""
    account: str = ""
    # The reclaim time where the notice says it (lifecycle: the hook's timeout; scheduled
    # change: the Health event's start time); None: the kind's fixed window.
    until: datetime | None = None
    lifecycle: Lifecycle | None = None


# The node annotation written with the interruption taint: which notice tainted the
# node and until when it is doomed (the reclaim time). The reconcile reads it to finish
# a handling cut off after the taint, and to remove the taint of a node that survived.
NODE_NOTICE = "spotguard.io/notice"
# The two-minute window of a spot interruption warning.
INTERRUPTION_WINDOW = 120.0


@dataclass(frozen=True)
class NodeNotice:
    """The notice recorded on a tainted node (``spotguard.io/notice``, JSON)."""

    event_id: str
    kind: NoticeKind
    time: float  # epoch seconds of the notice
    until: float  # epoch seconds: the reclaim time (or the end of a rebalance's surge)
    state: str = ""
    action: str = ""
    lifecycle: Lifecycle | None = None

    def to_json(self) -> str:
        out: dict[str, object] = {
            "event": self.event_id,
            "kind": str(self.kind),
            "time": round(self.time, 3),
            "until": round(self.until, 3),
        }
        if self.state:
            out["state"] = self.state
        if self.action:
            out["action"] = self.action
        if self.lifecycle is not None:
            out["asg"] = self.lifecycle.group
            out["hook"] = self.lifecycle.hook
            out["token"] = self.lifecycle.token
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> NodeNotice | None:
        """The notice in ``text``, or None where there is none (never raises)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return cls(
                event_id=str(raw["event"]),
                kind=NoticeKind(raw["kind"]),
                time=float(raw["time"]),
                until=float(raw["until"]),
                state=str(raw.get("state") or ""),
                action=str(raw.get("action") or ""),
                lifecycle=(
                    Lifecycle(str(raw["asg"]), str(raw["hook"]), str(raw["token"]))
                    if raw.get("asg") and raw.get("hook") and raw.get("token")
                    else None
                ),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
