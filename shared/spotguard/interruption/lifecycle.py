"""ASG lifecycle hooks: hold a terminating instance until its surge is Ready, then let it go.

An ``EC2 Instance-terminate Lifecycle Action`` (an Auto Scaling group's terminate
lifecycle hook) keeps the instance in ``Terminating:Wait`` until someone completes
the action or the hook's heartbeat timeout passes. As aws-node-termination-handler
does in queue mode, the handler:

- reads the hook's timeouts (``DescribeLifecycleHooks``, once per hook): the reclaim
  time of the notice is the hook's global timeout (the longest heartbeats can hold the
  instance: 100 heartbeat timeouts, at most 48 hours), counted from the notice;
- sends ``RecordLifecycleActionHeartbeat`` at every pass while the surge of the node's
  workloads is not Ready (at most once per half heartbeat timeout);
- sends ``CompleteLifecycleAction`` (``CONTINUE``) once it is
  (:func:`spotguard.policy.evictions.node_replaced`): the group terminates the instance.

The action is recorded on the node with its mark (``spotguard.io/notice``: group,
hook and token), so any process's pass finishes it. A refused call is logged and
tried again at the next pass; an action AWS no longer knows (completed, timed out)
is forgotten.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from spotguard.interruption import finder
from spotguard.policy.notices import Lifecycle

log = logging.getLogger("spotguard.interruption")

# Auto Scaling's defaults: a hook's heartbeat timeout, and the global timeout's bounds.
DEFAULT_HEARTBEAT_SECONDS = 3600.0
MAX_GLOBAL_SECONDS = 172800.0


@dataclass(frozen=True)
class Timeouts:
    heartbeat: float  # HeartbeatTimeout
    global_: float  # GlobalTimeout: the longest heartbeats can hold the instance

    @classmethod
    def default(cls) -> Timeouts:
        return cls(DEFAULT_HEARTBEAT_SECONDS, min(100 * DEFAULT_HEARTBEAT_SECONDS, MAX_GLOBAL_SECONDS))


class Hooks:
    """The Auto Scaling calls for lifecycle actions, with what this process remembers."""

    def __init__(self, autoscaling: object, clock: Callable[[], float]) -> None:
        self.client = autoscaling
        self.clock = clock
        self._timeouts: dict[tuple[str, str], Timeouts] = {}
        self._beats: dict[str, float] = {}  # token -> when this process last sent a heartbeat
        self._done: set[str] = set()  # tokens completed (or no longer known to AWS)
        self._lock = threading.Lock()

    def timeouts(self, life: Lifecycle) -> Timeouts:
        key = (life.group, life.hook)
        with self._lock:
            known = self._timeouts.get(key)
        if known is not None:
            return known
        try:
            answer = self.client.describe_lifecycle_hooks(  # type: ignore[attr-defined]
                AutoScalingGroupName=life.group, LifecycleHookNames=[life.hook]
            )
            [hook] = answer.get("LifecycleHooks") or [{}]
            heartbeat = float(hook.get("HeartbeatTimeout") or DEFAULT_HEARTBEAT_SECONDS)
            global_ = float(hook.get("GlobalTimeout") or MAX_GLOBAL_SECONDS)
            found = Timeouts(heartbeat, min(global_, 100 * heartbeat, MAX_GLOBAL_SECONDS))
        except Exception as exc:  # botocore's ClientError, a connection error, no such hook
            log.warning(
                "could not read the lifecycle hook's timeouts: assuming Auto Scaling's defaults",
                extra={"group": life.group, "hook": life.hook, "error": str(exc)[:300]},
            )
            return Timeouts.default()
        with self._lock:
            self._timeouts[key] = found
        return found

    def done(self, life: Lifecycle) -> bool:
        with self._lock:
            return life.token in self._done

    def heartbeat(self, life: Lifecycle, instance_id: str) -> None:
        """RecordLifecycleActionHeartbeat, unless this process sent one within half a heartbeat timeout."""
        now = self.clock()
        with self._lock:
            last = self._beats.get(life.token)
        if last is not None and now - last < self.timeouts(life).heartbeat / 2:
            return
        if self._call("record_lifecycle_action_heartbeat", life, instance_id):
            with self._lock:
                self._beats[life.token] = now
            log.info("lifecycle action held: its surge is not Ready yet", extra=_fields(life, instance_id))

    def complete(self, life: Lifecycle, instance_id: str) -> None:
        """CompleteLifecycleAction CONTINUE: the group terminates the instance now."""
        if self.done(life):
            return
        if self._call("complete_lifecycle_action", life, instance_id, LifecycleActionResult="CONTINUE"):
            with self._lock:
                self._done.add(life.token)
            log.info("lifecycle action completed: the surge is Ready", extra=_fields(life, instance_id))

    def _call(self, method: str, life: Lifecycle, instance_id: str, **extra: str) -> bool:
        try:
            getattr(self.client, method)(
                AutoScalingGroupName=life.group,
                LifecycleHookName=life.hook,
                LifecycleActionToken=life.token,
                InstanceId=instance_id,
                **extra,
            )
        except Exception as exc:
            code = finder.error_code(exc)
            if code == "ValidationError" and "No active Lifecycle Action" in str(exc):
                # Completed already (another process), timed out, or abandoned: nothing to hold.
                with self._lock:
                    self._done.add(life.token)
                log.info("lifecycle action is over already", extra=_fields(life, instance_id))
                return False
            log.warning(
                "lifecycle action call failed; tried again at the next pass",
                extra={**_fields(life, instance_id), "call": method, "error": str(exc)[:300]},
            )
            return False
        return True


def _fields(life: Lifecycle, instance_id: str) -> dict[str, str]:
    return {"group": life.group, "hook": life.hook, "instance_id": instance_id}
