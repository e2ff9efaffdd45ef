"""The Lambda SQS batch: one plan per batch, and batchItemFailures listing only what must come back."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from spotguard.interruption import events, sqs

from tests.interruption.transport_support import (
    NTH_INSTANCE,
    SPOT_INSTANCE,
    RecordingHandler,
    record,
    sample,
)


def test_a_batch_is_one_call_to_the_handler_in_record_order() -> None:
    # GIVEN the three AWS samples in one Lambda SQS batch
    batch = sample("sqs-batch.json")
    handler = RecordingHandler()
    # WHEN it is handled
    answer = sqs.handle_batch(batch, handler)
    # THEN the handler saw one batch of three notices, in order, and nothing comes back
    assert [[n.kind.value for n in call] for call in handler.calls] == [["interruption", "rebalance", "state-change"]]
    assert answer == {"batchItemFailures": []}


def test_malformed_and_foreign_messages_are_acknowledged_with_a_clear_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a batch with two notices, a text message, an Auto Scaling event, the AWS
    # documentation's sample with its placeholders left in, and a JSON array
    batch = sample("sqs-batch-mixed.json")
    handler = RecordingHandler()
    caplog.set_level(logging.INFO, logger="spotguard.interruption")
    # WHEN it is handled
    answer = sqs.handle_batch(batch, handler)
    # THEN only the two notices reach the handler, and nothing is retried
    assert [n.instance_id for n in handler.calls[0]] == [SPOT_INSTANCE, NTH_INSTANCE]
    assert answer == {"batchItemFailures": []}
    # AND every acknowledged message has a log line naming it and saying why
    lines = {r.message_id: r for r in caplog.records if r.getMessage().startswith("acknowledged")}  # type: ignore[attr-defined]
    assert set(lines) == {
        "22222222-f796-459a-8184-9c92662be6da",
        "33333333-a70a-42c7-a470-796e1186f753",
        "44444444-a70a-42c7-a470-796e1186f753",
        "55555555-a70a-42c7-a470-796e1186f753",
    }
    assert "is not JSON" in lines["22222222-f796-459a-8184-9c92662be6da"].getMessage()
    assert lines["33333333-a70a-42c7-a470-796e1186f753"].error == "foreign"  # type: ignore[attr-defined]
    assert lines["33333333-a70a-42c7-a470-796e1186f753"].levelno == logging.INFO
    assert lines["44444444-a70a-42c7-a470-796e1186f753"].levelno == logging.WARNING
    assert "not an RFC 3339 timestamp" in lines["44444444-a70a-42c7-a470-796e1186f753"].getMessage()


def test_batch_item_failures_list_only_the_retried_messages() -> None:
    # GIVEN a handler that fails the notice for one instance transiently
    batch = {
        "Records": [
            record(json.dumps(sample("ec2-spot-instance-interruption-warning.json")), "m-1"),
            record("not json", "m-2"),
            record(json.dumps(sample("ec2-spot-instance-interruption-warning.nth.json")), "m-3"),
            record(json.dumps(sample("ec2-instance-rebalance-recommendation.nth.json")), "m-4"),
        ]
    }
    handler = RecordingHandler(outcomes={NTH_INSTANCE: "retry"})
    # WHEN the batch is handled
    answer = sqs.handle_batch(batch, handler)
    # THEN exactly the messages for that instance come back; the malformed one does not
    assert answer == {"batchItemFailures": [{"itemIdentifier": "m-3"}, {"itemIdentifier": "m-4"}]}


def test_an_ignored_notice_is_acknowledged() -> None:
    batch = {"Records": [record(json.dumps(sample("ec2-spot-instance-interruption-warning.json")), "m-1")]}
    handler = RecordingHandler(outcomes={SPOT_INSTANCE: "ignored"})
    assert sqs.handle_batch(batch, handler) == {"batchItemFailures": []}


def test_a_handler_that_raises_retries_its_notices_not_the_malformed_ones(caplog: pytest.LogCaptureFixture) -> None:
    batch = sample("sqs-batch-mixed.json")
    handler = RecordingHandler(raises=ConnectionError("API server unreachable"))
    answer = sqs.handle_batch(batch, handler)
    assert sqs_ids(answer) == ["11111111-87a3-44ab-83d2-661975830a7d", "66666666-a70a-42c7-a470-796e1186f753"]
    assert any("asking for redelivery" in r.getMessage() for r in caplog.records)


def test_a_handler_answering_the_wrong_number_of_outcomes_retries_everything() -> None:
    class Short(RecordingHandler):
        def handle(self, notices):  # type: ignore[no-untyped-def]
            super().handle(notices)
            return ["done"]

    answer = sqs.handle_batch(sample("sqs-batch.json"), Short())
    assert len(answer["batchItemFailures"]) == 3


def test_an_unknown_outcome_is_retried() -> None:
    batch = {"Records": [record(json.dumps(sample("ec2-spot-instance-interruption-warning.json")), "m-1")]}
    answer = sqs.handle_batch(batch, RecordingHandler(outcomes={SPOT_INSTANCE: "maybe"}))
    assert sqs_ids(answer) == ["m-1"]


def test_records_without_a_body_or_that_are_not_objects_are_acknowledged() -> None:
    batch = {"Records": [{"messageId": "m-1", "eventSource": "aws:sqs"}, "oops"]}
    handler = RecordingHandler()
    assert sqs.handle_batch(batch, handler) == {"batchItemFailures": []}
    assert handler.calls == []


def test_an_event_without_records_is_malformed() -> None:
    with pytest.raises(events.Malformed, match="no 'Records' list"):
        sqs.handle_batch({"records": []}, RecordingHandler())


def test_duplicates_in_one_batch_all_reach_the_handler_as_one_plan() -> None:
    # The handler, not the transport, makes ten copies of a notice surge once.
    body = json.dumps(sample("ec2-spot-instance-interruption-warning.json"))
    batch = {"Records": [record(body, f"m-{i}") for i in range(10)]}
    handler = RecordingHandler()
    assert sqs.handle_batch(batch, handler) == {"batchItemFailures": []}
    assert len(handler.calls) == 1 and len(handler.calls[0]) == 10


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (sample("sqs-batch.json"), True),
        ({"Records": [{"eventSource": "aws:sqs"}]}, True),
        ({"Records": []}, False),
        ({"Records": [{"eventSource": "aws:s3", "s3": {}}]}, False),
        (sample("ec2-spot-instance-interruption-warning.json"), False),
        ([], False),
    ],
)
def test_is_batch(event: object, expected: bool) -> None:
    assert sqs.is_batch(event) is expected


def test_decode_message_reads_the_sqs_api_shape() -> None:
    body = json.dumps(sample("ec2-instance-rebalance-recommendation.json"))
    item = sqs.decode_message({"MessageId": "abc", "ReceiptHandle": "rh", "Body": body})
    assert item.key == "abc"
    assert item.notice is not None and item.notice.instance_id == SPOT_INSTANCE
    assert sqs.decode_message({"MessageId": "abc"}).error is not None


def sqs_ids(answer: sqs.BatchResponse) -> list[str]:
    return [failure["itemIdentifier"] for failure in answer["batchItemFailures"]]


def test_a_record_whose_attributes_are_not_an_object_is_failed_not_crashed() -> None:
    # GIVEN a batch whose record has a number where SQS puts its attributes (found by fuzzing)
    class Nothing:
        def handle(self, notices: Any) -> list[object]:
            raise AssertionError("a malformed record reaches no handler")

        def reconcile(self) -> None:
            return None

    event = {"Records": [{"messageId": "m-1", "body": "{}", "attributes": 1.5}]}
    # WHEN the batch is handled THEN it answers (a malformed message is acknowledged, not retried forever)
    answer = sqs.handle_batch(event, Nothing())
    assert answer == {"batchItemFailures": []}
