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

    def to_json(self) -> str:
        out = {
            "event": self.event_id,
            "kind": str(self.kind),
            "time": round(self.time, 3),
            "until": round(self.until, 3),
        }
        if self.state:
            out["state"] = self.state
        if self.action:
            out["action"] = self.action
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
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
