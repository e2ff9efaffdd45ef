"""SQS messages holding EventBridge events: the Lambda SQS batch and its partial answer.

Lambda hands the function ``{"Records": [record, ...]}`` (see :class:`SQSRecord`)
and, with ``ReportBatchItemFailures`` on the event source mapping, takes back
``{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}``: exactly the
messages to deliver again. Everything else in the batch is deleted from the
queue, so malformed and foreign messages are acknowledged here (with a log
line) rather than retried until they reach the dead-letter queue.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from spotguard.interruption import dispatch, events

log = logging.getLogger("spotguard.interruption")

EVENT_SOURCE = "aws:sqs"


class SQSMessageAttribute(TypedDict, total=False):
    stringValue: str
    binaryValue: str
    stringListValues: list[str]
    binaryListValues: list[str]
    dataType: str


class SQSRecordAttributes(TypedDict, total=False):
    ApproximateReceiveCount: str
    SentTimestamp: str
    SenderId: str
    ApproximateFirstReceiveTimestamp: str
    AWSTraceHeader: str
    DeadLetterQueueSourceArn: str
    MessageGroupId: str
    MessageDeduplicationId: str
    SequenceNumber: str


class SQSRecord(TypedDict):
    """One record of a Lambda SQS event, as Lambda sends it."""

    messageId: str
    receiptHandle: str
    body: str
    attributes: SQSRecordAttributes
    messageAttributes: dict[str, SQSMessageAttribute]
    md5OfBody: str
    md5OfMessageAttributes: NotRequired[str | None]
    eventSource: Literal["aws:sqs"]
    eventSourceARN: str
    awsRegion: str


class SQSEvent(TypedDict):
    Records: list[SQSRecord]


class BatchItemFailure(TypedDict):
    itemIdentifier: str


class BatchResponse(TypedDict):
    batchItemFailures: list[BatchItemFailure]


def is_batch(event: object) -> bool:
    """True for a Lambda SQS event: ``Records`` whose items come from ``aws:sqs``."""
    if not isinstance(event, Mapping):
        return False
    records = event.get("Records")
    if not isinstance(records, list) or not records:
        return False
    return all(isinstance(r, Mapping) and (r.get("eventSource") == EVENT_SOURCE or "messageId" in r) for r in records)


def decode_record(record: object, index: int = 0) -> dispatch.Delivery:
    """One Lambda SQS record (its ``body`` an EventBridge event) -> a delivery item."""
    if not isinstance(record, Mapping):
        return dispatch.Delivery(
            key=f"Records[{index}]",
            error=events.Malformed(f"Records[{index}] is not an object"),
        )
    message_id = record.get("messageId")
    key = message_id if isinstance(message_id, str) and message_id else f"Records[{index}]"
    body = record.get("body")
    if not isinstance(body, str):
        return dispatch.Delivery(key=key, error=events.Malformed(f"SQS message {key} has no string 'body'"))
    return dispatch.Delivery.decode(key, lambda: events.decode_json_all(body, what=f"SQS message {key} body"))


def decode_message(message: Mapping[str, Any]) -> dispatch.Delivery:
    """An SQS message as the SQS API returns it (``MessageId``, ``Body``) -> a delivery item."""
    message_id = message.get("MessageId") or message.get("messageId") or ""
    key = str(message_id) or "message"
    body = message.get("Body", message.get("body"))
    if not isinstance(body, str):
        return dispatch.Delivery(key=key, error=events.Malformed(f"SQS message {key} has no string 'Body'"))
    return dispatch.Delivery.decode(key, lambda: events.decode_json_all(body, what=f"SQS message {key} body"))


def handle_batch(
    event: Mapping[str, Any], handler: dispatch.Handler, *, retry_delay: int | None = None
) -> BatchResponse:
    """Handle a Lambda SQS event; the answer lists only the messages to deliver again."""
    records = event.get("Records")
    if not isinstance(records, list):
        raise events.Malformed("the Lambda event has no 'Records' list")
    items = [decode_record(record, index) for index, record in enumerate(records)]
    results = dispatch.deliver(handler, items, transport="lambda-sqs")
    failures: list[BatchItemFailure] = []
    failed_groups: set[str] = set()
    retry: list[Mapping[str, Any]] = []
    for record, item, result in zip(records, items, results, strict=True):
        group = _group(record)
        if result.acknowledged and not (group and group in failed_groups):
            continue
        # FIFO: once a message of a group fails, every later one of the group is reported
        # too (Lambda requires it: the group's order must hold on redelivery).
        if group:
            failed_groups.add(group)
        if isinstance(record, Mapping):
            retry.append(record)
        # A retried item always decoded (or follows one in its FIFO group): it has its messageId.
        failures.append({"itemIdentifier": item.key})
        receive_count = str(_attributes(record).get("ApproximateReceiveCount", ""))
        log.warning(
            "asking SQS to deliver message %s again",
            item.key,
            extra={"message_id": item.key, "receive_count": receive_count},
        )
    if retry and retry_delay is not None:
        _retry_soon(retry, retry_delay)
    return {"batchItemFailures": failures}


# A failed notice is delivered again after this many seconds (the queue's visibility
# timeout would be much longer: the two-minute window would be over).
RETRY_DELAY_SECONDS = 2


def retry_delay_from_env(env: Mapping[str, str]) -> int | None:
    """``$SPOTGUARD_SQS_RETRY_SECONDS``; in Lambda (``$AWS_LAMBDA_FUNCTION_NAME``) 2 s by default."""
    raw = env.get("SPOTGUARD_SQS_RETRY_SECONDS")
    if raw:
        try:
            return max(0, min(int(raw), 43200))
        except ValueError:
            log.warning("SPOTGUARD_SQS_RETRY_SECONDS is not a number; using %ds", RETRY_DELAY_SECONDS)
            return RETRY_DELAY_SECONDS
    return RETRY_DELAY_SECONDS if env.get("AWS_LAMBDA_FUNCTION_NAME") else None


def _attributes(record: object) -> Mapping[str, Any]:
    """A record's ``attributes`` when it and they are objects (a malformed record has none)."""
    attributes = record.get("attributes") if isinstance(record, Mapping) else None
    return attributes if isinstance(attributes, Mapping) else {}


def _group(record: object) -> str:
    return str(_attributes(record).get("MessageGroupId") or "")


def _retry_soon(records: list[Mapping[str, Any]], delay: int) -> None:
    """Make the failed messages visible again in ``delay`` seconds (ChangeMessageVisibility).

    Best effort: without it the queue's visibility timeout applies. The queue URL comes
    from the record's ``eventSourceARN`` (``arn:aws:sqs:<region>:<account>:<name>``).
    """
    try:
        import boto3

        clients: dict[str, Any] = {}
        urls: dict[str, str] = {}
        for record in records:
            arn = str(record.get("eventSourceARN") or "")
            parts = arn.split(":")
            if len(parts) < 6 or not record.get("receiptHandle"):
                continue
            region, account, name = parts[3], parts[4], parts[5]
            client = clients.setdefault(region, boto3.client("sqs", region_name=region))
            if arn not in urls:
                urls[arn] = client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
            client.change_message_visibility(
                QueueUrl=urls[arn], ReceiptHandle=record["receiptHandle"], VisibilityTimeout=delay
            )
    except Exception as exc:  # botocore errors, no credentials: the visibility timeout applies
        log.warning("could not bring failed messages back sooner", extra={"error": str(exc)})
