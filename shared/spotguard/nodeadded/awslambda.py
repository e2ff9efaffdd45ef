"""The AWS Lambda entry: an EC2 state change (``running``) or a schedule.

``functions/node-added/lambda_function.py`` calls :func:`handle` with the event
Lambda received:

- an EventBridge ``EC2 Instance State-change Notification`` (a rule targeting
  the function): state ``running`` waits for the node to join (within
  ``$SPOTGUARD_NODE_JOIN_WAIT_SECONDS``), then runs a pass; other states are
  acknowledged;
- a schedule: an EventBridge Scheduler input ``{"spotguard": "reconcile", ...}``,
  or a ``Scheduled Event`` rule: runs a pass.

A pass that could not run raises :class:`RetryLater` (Lambda's asynchronous
retries deliver it again); foreign and malformed events return normally.
"""

from __future__ import annotations

from typing import Any

from spotguard.nodeadded import service, triggers


class RetryLater(RuntimeError):
    """A transient failure: raised so that Lambda reports an error and the event is retried."""


def handle(event: object, svc: service.Service) -> dict[str, Any]:
    if not isinstance(event, dict):
        return {"result": "malformed", "reason": "the event is not a JSON object"}
    try:
        trigger = triggers.from_eventbridge(event, "Lambda event")
    except triggers.TriggerError as exc:
        result = "foreign" if isinstance(exc, triggers.Foreign) else "malformed"
        service.log.info("acknowledged without a pass: %s", exc.message, extra={"result": result})
        return {"result": result, "reason": exc.message}
    try:
        return svc.handle(trigger).to_json()
    except service.Transient as exc:
        raise RetryLater(str(exc)) from exc
