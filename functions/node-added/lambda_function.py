"""The node-added function as an AWS Lambda.

Handler: ``lambda_function.lambda_handler``. One function takes every shape
(see :mod:`spotguard.nodeadded.awslambda`):

- an EventBridge ``EC2 Instance State-change Notification`` with state
  ``running`` (a rule targeting the function): waits for the node to join,
  within ``SPOTGUARD_NODE_JOIN_WAIT_SECONDS`` (keep it inside the function's
  timeout), then runs a pass; a node that joins later is the next schedule's;
- a schedule (EventBridge Scheduler with input ``{"spotguard": "reconcile"}``,
  or a ``Scheduled Event`` rule): runs a pass.

The reconciler (API connection, settings) lives in the module, so a warm
execution environment reuses it. The cluster is reached with an EKS token when
``SPOTGUARD_EKS_CLUSTER`` is set.
"""

from __future__ import annotations

from typing import Any

from spotguard import logs
from spotguard.nodeadded import awslambda, service

logs.configure()  # at import, before any line: every line as JSON, through the runtime's handler


def _reconciler() -> Any:
    from spotguard.nodeadded.reconciler import Reconciler

    return Reconciler.from_environment()


# Built on first use: a foreign event is acknowledged even while the cluster is unreachable.
_service = service.Service(_reconciler)


def lambda_handler(event: Any, context: Any) -> dict[str, Any]:
    return awslambda.handle(event, _service)
