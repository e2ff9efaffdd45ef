"""The AWS Lambda entry: an SQS batch, a direct EventBridge event, or a schedule.

``functions/spot-interruption/lambda_function.py`` calls :func:`handle` with
the event Lambda received:

- ``{"Records": [...]}`` from the SQS event source mapping: answered with
  ``{"batchItemFailures": [...]}`` (ReportBatchItemFailures) listing only the
  messages to deliver again;
- an EventBridge event (a rule targeting the function directly): a transient
  failure raises :class:`RetryLater`, so Lambda's asynchronous retries and the
  rule's retry policy deliver it again; malformed and foreign events return
  normally (acknowledged, never retried);
- a schedule: an EventBridge ``Scheduled Event`` (source ``aws.events``), or an
  EventBridge Scheduler invocation whose input is ``{"spotguard": "reconcile"}``
  (source ``aws.scheduler`` also accepted): runs ``handler.reconcile()``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from spotguard.interruption import dispatch, events, sqs

log = logging.getLogger("spotguard.interruption")

RECONCILE_INPUT = {"spotguard": "reconcile"}


class RetryLater(RuntimeError):
    """A transient failure: raised so that Lambda reports an error and the event is retried."""


def is_schedule(event: object) -> bool:
    """An EventBridge rule schedule, or an EventBridge Scheduler invocation for spotguard."""
    if not isinstance(event, Mapping):
        return False
    if event.get("spotguard") == "reconcile":
        return True
    if event.get("source") == "aws.events" and event.get("detail-type") == "Scheduled Event":
        return True
    return event.get("source") == "aws.scheduler"


def handle(event: object, handler: dispatch.Handler) -> dict[str, Any]:
    """Handle one Lambda invocation; see the module docstring for the shapes."""
    if sqs.is_batch(event):
        assert isinstance(event, Mapping)
        return dict(sqs.handle_batch(event, handler, retry_delay=sqs.retry_delay_from_env(os.environ)))
    if is_schedule(event):
        if not dispatch.reconcile(handler, transport="lambda-schedule"):
            raise RetryLater("reconcile failed; see the log")
        return {"result": "reconciled"}
    key = ""
    if isinstance(event, Mapping) and isinstance(event.get("id"), str):
        key = event["id"]
    item = dispatch.Delivery.decode(key or "event", lambda: events.decode_all(event, "Lambda event"))
    [result] = dispatch.deliver(handler, [item], transport="lambda-direct")
    answer: dict[str, Any] = {"result": result.value}
    if item.notice is not None:
        answer["notice"] = events.to_json(item.notice)
    if item.error is not None:
        answer["reason"] = item.error.message
    if result is dispatch.Result.RETRY:
        raise RetryLater(f"notice {key} failed transiently; deliver it again")
    return answer
