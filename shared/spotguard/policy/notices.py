"""EC2 notices as the policy sees them, whatever transport delivered them."""

from __future__ import annotations

import enum
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
