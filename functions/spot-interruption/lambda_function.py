"""The spot-interruption function as an AWS Lambda.

Handler: ``lambda_function.lambda_handler``. One function takes every shape
(see :mod:`spotguard.interruption.awslambda`):

- an SQS batch from the event source mapping (enable ``ReportBatchItemFailures``):
  answered with ``{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}``;
- an EventBridge event from a rule that targets the function directly;
- a schedule (EventBridge Scheduler with input ``{"spotguard": "reconcile"}``,
  or a ``Scheduled Event`` rule): scales surges back.

The handler (API connection, settings, EC2 client) lives in the module, so a
warm execution environment reuses it. The cluster is reached with an EKS token
when ``SPOTGUARD_EKS_CLUSTER`` is set.
"""

from __future__ import annotations

import threading
from typing import Any

from spotguard import emf, logs
from spotguard.interruption import awslambda, dispatch

logs.configure()  # at import, before any line: every line as JSON, through the runtime's handler
_state: dict[str, dispatch.Handler] = {}
_lock = threading.Lock()


def _handler() -> dispatch.Handler:
    with _lock:
        if "handler" not in _state:
            from spotguard.interruption import handler

            _state["handler"] = dispatch.Serialized(handler.Handler.from_environment())
        return _state["handler"]


def handle(event: Any, context: Any) -> dict[str, Any]:
    # Built on first use: a batch of malformed or foreign messages is acknowledged
    # even while the cluster is unreachable; notices are then retried.
    return awslambda.handle(event, dispatch.Lazy(_handler))


# CloudWatch metrics (EMF) around every invocation: spotguard.emf.
lambda_handler = emf.instrument("spot-interruption", emf.sqs_batch)(handle)
