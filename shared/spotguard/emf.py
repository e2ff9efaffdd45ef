"""CloudWatch metrics of the Lambda functions, in the embedded metric format (EMF).

A Lambda function's ``lambda_function.py`` wraps its handler::

    lambda_handler = emf.instrument("spot-interruption", emf.sqs_batch)(handle)

After each invocation, ``summarize(event, result)`` gives counts that
aws-lambda-powertools' ``Metrics`` prints as one EMF JSON line; CloudWatch Logs
turns it into metrics in namespace ``spotguard`` with the dimension
``service=<function>`` (no PutMetricData call, no extra IAM). A handler that
raises adds ``HandlerErrors`` before the error propagates. The SAM template
alarms on these and on AWS/Lambda ``Errors``.

Only the Lambda zips carry aws-lambda-powertools (``spotguard[lambda]``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

NAMESPACE = "spotguard"

Handler = Callable[[Any, Any], Any]
Summary = Callable[[Any, Any], Mapping[str, float]]


def instrument(function: str, summarize: Summary) -> Callable[[Handler], Handler]:
    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.metrics import MetricUnit

    metrics = Metrics(namespace=NAMESPACE, service=function)

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def wrapped(event: Any, context: Any) -> Any:
            try:
                result = handler(event, context)
            except Exception:
                metrics.add_metric(name="HandlerErrors", unit=MetricUnit.Count, value=1)
                raise
            for name, value in summarize(event, result).items():
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
            return result

        logged: Handler = metrics.log_metrics(wrapped)
        return logged

    return decorate


def sqs_batch(event: Any, result: Any) -> dict[str, float]:
    """spot-interruption: messages received and retried (``batchItemFailures``), reconciles."""
    if isinstance(event, Mapping) and isinstance(event.get("Records"), list):
        failures = result.get("batchItemFailures") if isinstance(result, Mapping) else None
        return {"Messages": len(event["Records"]), "BatchItemFailures": len(failures or [])}
    return {"Invocations": 1}


def admission_review(event: Any, result: Any) -> dict[str, float]:
    """admission: reviews answered, pods patched, malformed requests (4xx)."""
    status = int(result.get("statusCode", 500)) if isinstance(result, Mapping) else 500
    patched = 0
    if status == 200:
        try:
            response = json.loads(result.get("body") or "{}").get("response") or {}
        except (ValueError, AttributeError):
            response = {}
        patched = 1 if response.get("patch") else 0
    return {"Reviews": 1, "Patched": patched, "BadRequests": 1 if 400 <= status < 500 else 0}
