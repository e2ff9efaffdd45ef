"""The local SQS poller against SQS (moto in server mode, real HTTP)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from spotguard.interruption.poller import Poller

from tests.interruption.transport_support import (
    NTH_INSTANCE,
    Moto,
    RecordingHandler,
    sample,
    unique,
    wait_for,
)


def make_queue(moto: Moto, visibility: int = 30) -> tuple[Any, str]:
    client = moto.client("sqs")
    url = client.create_queue(QueueName=unique("poller"), Attributes={"VisibilityTimeout": str(visibility)})["QueueUrl"]
    return client, url


def send(client: Any, url: str, body: str) -> str:
    return str(client.send_message(QueueUrl=url, MessageBody=body)["MessageId"])


def visible(client: Any, url: str) -> list[dict[str, Any]]:
    """Receive whatever is visible now (and so hide it again for the queue's visibility timeout)."""
    answer = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageSystemAttributeNames=["All"]
    )
    return list(answer.get("Messages", []))


def test_deletes_what_was_handled_and_leaves_retries_to_reappear(moto_server: Moto) -> None:
    # GIVEN a queue with a notice, a notice the handler fails transiently, a text message and
    # an Auto Scaling event
    client, url = make_queue(moto_server)
    done = send(client, url, json.dumps(sample("ec2-spot-instance-interruption-warning.json")))
    again = send(client, url, json.dumps(sample("ec2-spot-instance-interruption-warning.nth.json")))
    text = send(client, url, "Hello from SQS!")
    foreign = send(client, url, json.dumps(sample("autoscaling-lifecycle-launch.json")))
    handler = RecordingHandler(outcomes={NTH_INSTANCE: "retry"})
    poller = Poller(client, url, handler, wait_seconds=1, retry_delay=1)
    # WHEN the poller runs one round
    round_ = poller.poll_once()
    # THEN the handler got both notices in one call
    assert round_.received == 4
    assert len(handler.calls) == 1 and len(handler.calls[0]) == 2
    # AND everything but the retried notice is deleted
    assert sorted(round_.deleted) == sorted([done, text, foreign])
    assert round_.retried == [again]
    # AND the retried one reappears after the retry delay, and only it
    reappeared = wait_for(lambda: visible(client, url), timeout=5)
    assert [m["MessageId"] for m in reappeared] == [again]
    assert reappeared[0]["Attributes"]["ApproximateReceiveCount"] == "2"


def test_a_burst_of_notices_is_gathered_into_few_plans(moto_server: Moto) -> None:
    # GIVEN 35 interruption warnings on the queue at once (every spot node of a cluster)
    client, url = make_queue(moto_server)
    ids = []
    for i in range(35):
        event = sample("ec2-spot-instance-interruption-warning.json")
        event["detail"]["instance-id"] = f"i-{i:017x}"
        ids.append(send(client, url, json.dumps(event)))
    handler = RecordingHandler()
    # (a window far longer than the gathering needs: the batch size is what ends the first round)
    poller = Poller(client, url, handler, wait_seconds=1, batch_size=25, batch_window=60)
    # WHEN the poller runs two rounds
    first, second = poller.poll_once(), poller.poll_once()
    # THEN the handler planned the first 25 at once, then the other 10, not in rounds of 10
    assert [len(c) for c in handler.calls] == [25, 10]
    assert first.received == 25 and second.received == 10
    assert len({n.instance_id for c in handler.calls for n in c}) == 35
    # AND every message was deleted
    assert sorted(first.deleted + second.deleted) == sorted(ids)
    assert visible(client, url) == []


def test_nothing_to_receive_is_a_quiet_round(moto_server: Moto) -> None:
    client, url = make_queue(moto_server)
    handler = RecordingHandler()
    started = time.monotonic()
    round_ = Poller(client, url, handler, wait_seconds=1).poll_once()
    assert round_.received == 0 and handler.calls == []
    assert time.monotonic() - started >= 0.9  # it long-polled


@pytest.mark.parametrize("extend", [True, False])
def test_visibility_is_extended_while_a_handling_runs(moto_server: Moto, extend: bool) -> None:
    # GIVEN a queue whose messages hide for 4 s, and a handling that takes 6 s (a heartbeat
    # every 0.5 s may come late by 3 s on a loaded machine and still hold the message)
    client, url = make_queue(moto_server, visibility=4)
    message_id = send(client, url, json.dumps(sample("ec2-spot-instance-interruption-warning.json")))
    handler = RecordingHandler(delay=6.0)
    poller = Poller(client, url, handler, wait_seconds=1, extend_every=0.5 if extend else 60)
    # WHEN the poller handles it while another consumer keeps receiving
    seen_by_other: list[str] = []
    stop = threading.Event()

    def other_consumer() -> None:
        other = moto_server.client("sqs")
        while not stop.wait(0.25):
            seen_by_other.extend(m["MessageId"] for m in visible(other, url))

    thread = threading.Thread(target=other_consumer)
    round_ = None
    thread.start()
    try:
        round_ = poller.poll_once()
    finally:
        stop.set()
        thread.join()
    assert round_ is not None
    if extend:
        # THEN with the heartbeat the other consumer never saw it, and it was deleted once handled
        assert round_.extended >= 3
        assert seen_by_other == []
        assert round_.deleted == [message_id]
    else:
        # (without it, the message reappears to the other consumer mid-handling: the test can fail)
        assert round_.extended == 0
        assert message_id in seen_by_other


def test_run_stops_cleanly(moto_server: Moto) -> None:
    client, url = make_queue(moto_server)
    handler = RecordingHandler()
    poller = Poller(client, url, handler, wait_seconds=1)
    thread = threading.Thread(target=poller.run)
    thread.start()
    try:
        send(client, url, json.dumps(sample("ec2-instance-rebalance-recommendation.json")))
        wait_for(lambda: handler.calls, timeout=10)
    finally:
        poller.stop()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert visible(client, url) == []


def test_errors_talking_to_sqs_are_survived(moto_server: Moto, caplog: pytest.LogCaptureFixture) -> None:
    # A queue that does not exist: every receive fails; run() logs, pauses, keeps trying until stopped.
    client = moto_server.client("sqs")
    url = f"{moto_server.url}/123456789012/{unique('missing')}"
    poller = Poller(client, url, RecordingHandler(), wait_seconds=0, visibility_timeout=5)
    thread = threading.Thread(target=poller.run)
    thread.start()
    time.sleep(1.5)
    poller.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    failures = [r for r in caplog.records if r.getMessage() == "SQS poll failed; trying again"]
    assert failures and failures[0].error == "QueueDoesNotExist"  # type: ignore[attr-defined]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_messages must be 1 to 10"):
        Poller(None, "url", RecordingHandler(), max_messages=11)
    with pytest.raises(ValueError, match="wait_seconds must be 0 to 20"):
        Poller(None, "url", RecordingHandler(), wait_seconds=21)
    with pytest.raises(ValueError, match="batch_size must be 1 to 10000"):
        Poller(None, "url", RecordingHandler(), batch_size=0)
    with pytest.raises(ValueError, match="batch_window must not be negative"):
        Poller(None, "url", RecordingHandler(), batch_window=-1)
