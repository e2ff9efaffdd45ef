"""A local SQS poller: the Lambda event source mapping, for running outside Lambda.

Each round:

1. ``ReceiveMessage`` with long polling (``WaitTimeSeconds`` 20) for up to 10
   messages; while the queue keeps answering, more (``WaitTimeSeconds`` 0), up
   to ``batch_size`` messages (100) or ``batch_window`` seconds (1), as the
   Lambda event source mapping's ``BatchSize`` and
   ``MaximumBatchingWindowInSeconds`` (infra/aws/template.yaml) gather a batch:
   every spot node of a large cluster at once is a few plans, not one per ten
   notices (each plan lists the cluster);
2. decode them and hand the notices to the handler as one plan, while a timer
   extends the messages' visibility (``ChangeMessageVisibilityBatch``) so that
   a long handling does not let them reappear to another consumer;
3. delete what was handled, ignored, malformed or foreign
   (``DeleteMessageBatch``); leave the ``RETRY`` ones on the queue, made
   visible again after ``retry_delay`` seconds, so the queue's redrive policy
   bounds their attempts.

:meth:`Poller.stop` (the CLI calls it on SIGTERM and SIGINT) ends the loop
after the current round: a handling in progress finishes and its messages are
deleted; a receive in progress returns within ``wait_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotguard.interruption import dispatch, sqs

log = logging.getLogger("spotguard.interruption")

MAX_MESSAGES = 10  # the SQS maximum for one ReceiveMessage
WAIT_SECONDS = 20  # the SQS maximum long poll
DEFAULT_VISIBILITY = 30  # the SQS default, when the queue's cannot be read
BATCH_SIZE = 100  # messages per plan at most (the template's event source mapping BatchSize)
BATCH_WINDOW = 1.0  # seconds spent gathering a batch (its MaximumBatchingWindowInSeconds)
MAX_BATCH_SIZE = 10_000  # Lambda's maximum BatchSize for a standard queue


@dataclass
class Round:
    """What one round did (for logs and tests)."""

    received: int = 0
    deleted: list[str] = field(default_factory=list)  # message ids
    retried: list[str] = field(default_factory=list)
    extended: int = 0  # visibility extensions sent


class Poller:
    def __init__(
        self,
        client: Any,
        queue_url: str,
        handler: dispatch.Handler,
        *,
        wait_seconds: int = WAIT_SECONDS,
        max_messages: int = MAX_MESSAGES,
        visibility_timeout: int | None = None,
        extend_every: float | None = None,
        retry_delay: int = 5,
        batch_size: int = BATCH_SIZE,
        batch_window: float = BATCH_WINDOW,
    ) -> None:
        """``client`` is a boto3 SQS client. ``visibility_timeout`` defaults to the queue's;
        the visibility is extended every ``extend_every`` seconds (default: a third of it).
        ``batch_size`` and ``batch_window`` bound the messages gathered into one plan."""
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise ValueError(f"max_messages must be 1 to {MAX_MESSAGES}, not {max_messages}")
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be 1 to {MAX_BATCH_SIZE}, not {batch_size}")
        if batch_window < 0:
            raise ValueError(f"batch_window must not be negative, not {batch_window}")
        if not 0 <= wait_seconds <= WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be 0 to {WAIT_SECONDS}, not {wait_seconds}")
        self.client = client
        self.queue_url = queue_url
        self.handler = handler
        self.wait_seconds = wait_seconds
        self.max_messages = max_messages
        self._visibility_override = visibility_timeout
        self.visibility_timeout = visibility_timeout or 0
        self.extend_every = extend_every
        self.retry_delay = retry_delay
        self.batch_size = batch_size
        self.batch_window = batch_window
        self._stop = threading.Event()

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        """Poll until :meth:`stop`. Errors talking to SQS are logged and retried after a pause."""
        self._resolve_visibility()
        log.info(
            "polling SQS",
            extra={
                "queue_url": self.queue_url,
                "wait_seconds": self.wait_seconds,
                "visibility_timeout": self.visibility_timeout,
            },
        )
        failures = 0
        while not self._stop.is_set():
            try:
                self.poll_once()
                failures = 0
            except Exception as exc:
                failures += 1
                pause = min(2.0**failures, 30.0)
                log.exception(
                    "SQS poll failed; trying again",
                    extra={"queue_url": self.queue_url, "error": type(exc).__name__, "pause": pause},
                )
                self._stop.wait(pause)
        log.info("stopped polling SQS", extra={"queue_url": self.queue_url})

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- one round -----------------------------------------------------------------------

    def poll_once(self) -> Round:
        """Receive one batch, handle it, delete what is done. Returns what happened."""
        if not self.visibility_timeout:
            self._resolve_visibility()
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": self.max_messages,
            "WaitTimeSeconds": self.wait_seconds,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        if self._visibility_override:
            request["VisibilityTimeout"] = self._visibility_override
        messages: list[Mapping[str, Any]] = self.client.receive_message(**request).get("Messages", [])
        messages = self._gather(messages, request)
        done = Round(received=len(messages))
        if not messages:
            return done
        items = [sqs.decode_message(message) for message in messages]
        results = self._handle(messages, items, done)
        finished = [m for m, r in zip(messages, results, strict=True) if r.acknowledged]
        again = [m for m, r in zip(messages, results, strict=True) if not r.acknowledged]
        done.deleted = self._delete(finished)
        done.retried = [str(m["MessageId"]) for m in again]
        if again:
            self._change_visibility(again, self.retry_delay, "retry")
            log.warning(
                "left %d message(s) on the queue to be delivered again",
                len(again),
                extra={"queue_url": self.queue_url, "message_ids": done.retried},
            )
        return done

    def _gather(self, messages: list[Mapping[str, Any]], request: dict[str, Any]) -> list[Mapping[str, Any]]:
        """More messages after a first answer, without waiting, up to the batch's size and window."""
        if not messages:
            return messages
        until = time.monotonic() + self.batch_window
        seen = {str(m.get("MessageId")) for m in messages}
        more_request = {**request, "WaitTimeSeconds": 0}
        while len(messages) < self.batch_size and time.monotonic() < until and not self._stop.is_set():
            more_request["MaxNumberOfMessages"] = min(self.max_messages, self.batch_size - len(messages))
            try:
                more = self.client.receive_message(**more_request).get("Messages", [])
            except Exception as exc:  # what was received is handled; the rest waits for the next round
                log.warning("SQS receive failed while gathering a batch", extra={"error": str(exc)})
                break
            if not more:
                break
            for m in more:
                # A standard queue may deliver a message twice: hand it over once (the handling is
                # idempotent anyway); the later receipt handle is the one that deletes it.
                if str(m.get("MessageId")) in seen:
                    messages = [m if str(x.get("MessageId")) == str(m.get("MessageId")) else x for x in messages]
                else:
                    seen.add(str(m.get("MessageId")))
                    messages.append(m)
        return messages

    def _handle(
        self, messages: Sequence[Mapping[str, Any]], items: list[dispatch.Delivery], done: Round
    ) -> list[dispatch.Result]:
        finished = threading.Event()
        interval = self.extend_every or max(self.visibility_timeout / 3, 1.0)

        def heartbeat() -> None:
            while not finished.wait(interval):
                if self._change_visibility(messages, self.visibility_timeout, "extend"):
                    done.extended += 1

        timer = threading.Thread(target=heartbeat, name="sqs-visibility", daemon=True)
        timer.start()
        try:
            return dispatch.deliver(self.handler, items, transport="sqs-poller")
        finally:
            finished.set()
            timer.join()

    # -- SQS calls -----------------------------------------------------------------------

    def _resolve_visibility(self) -> None:
        if self._visibility_override:
            self.visibility_timeout = self._visibility_override
            return
        try:
            attributes = self.client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]
            )["Attributes"]
            self.visibility_timeout = int(attributes["VisibilityTimeout"]) or DEFAULT_VISIBILITY
        except Exception as exc:
            self.visibility_timeout = DEFAULT_VISIBILITY
            log.warning(
                "could not read the queue's visibility timeout; assuming %ds",
                DEFAULT_VISIBILITY,
                extra={"queue_url": self.queue_url, "error": str(exc)},
            )

    def _delete(self, messages: Sequence[Mapping[str, Any]]) -> list[str]:
        deleted: list[str] = []
        for chunk in _chunks(messages):
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)]
            try:
                answer = self.client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception as exc:
                # The messages reappear after their visibility timeout and are handled again:
                # harmless, because handling is idempotent.
                log.error(
                    "could not delete handled messages",
                    extra={"queue_url": self.queue_url, "error": str(exc)},
                )
                continue
            failed = {f["Id"]: f for f in answer.get("Failed", [])}
            for i, m in enumerate(chunk):
                if str(i) in failed:
                    log.error(
                        "could not delete a handled message",
                        extra={"message_id": m["MessageId"], "reason": failed[str(i)].get("Message", "")},
                    )
                else:
                    deleted.append(str(m["MessageId"]))
        return deleted

    def _change_visibility(self, messages: Sequence[Mapping[str, Any]], seconds: int, why: str) -> bool:
        ok = True
        for chunk in _chunks(messages):
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": seconds}
                for i, m in enumerate(chunk)
            ]
            try:
                answer = self.client.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception as exc:
                ok = False
                log.warning(
                    "could not change message visibility (%s)",
                    why,
                    extra={"queue_url": self.queue_url, "error": str(exc)},
                )
                continue
            if answer.get("Failed"):
                ok = False
                log.warning(
                    "could not change message visibility (%s) for %d message(s)",
                    why,
                    len(answer["Failed"]),
                    extra={"queue_url": self.queue_url, "failed": answer["Failed"]},
                )
        return ok


def _chunks(messages: Sequence[Mapping[str, Any]]) -> list[Sequence[Mapping[str, Any]]]:
    return [messages[i : i + MAX_MESSAGES] for i in range(0, len(messages), MAX_MESSAGES)]
