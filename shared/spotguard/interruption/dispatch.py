"""Hand a delivery's notices to the handler as one plan, and say what became of each.

Every transport (Lambda SQS batch, CloudEvents, the local poller, a direct
Lambda invocation) decodes its payloads into :class:`Delivery` items and calls
:func:`deliver`. Items that failed to decode are acknowledged here with a log
line; the rest go to ``handler.handle`` in a single call (a burst of notices is
one plan), and the answer is one :class:`Result` per item, in order.

Only :attr:`Result.RETRY` asks the sender to deliver again (``batchItemFailures``,
an HTTP 5xx, a message left on the queue). A handler that raises is a
transient failure of every notice it was given, never of the undecodable ones.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, cast, runtime_checkable

from spotguard import readiness
from spotguard.interruption import events, telemetry
from spotguard.policy.notices import Notice

log = logging.getLogger("spotguard.interruption")


class Result(enum.StrEnum):
    DONE = "done"  # handled
    IGNORED = "ignored"  # acknowledged: not in this cluster, nothing to do
    RETRY = "retry"  # transient failure: deliver again
    MALFORMED = "malformed"  # acknowledged: cannot be read
    FOREIGN = "foreign"  # acknowledged: not ours

    @property
    def acknowledged(self) -> bool:
        """True when the sender must not deliver this again."""
        return self is not Result.RETRY


class Handler(Protocol):
    """What the transports need of ``spotguard.interruption.handler.Handler``."""

    def handle(self, notices: Sequence[Notice]) -> Sequence[object]: ...

    def reconcile(self) -> None: ...


@runtime_checkable
class Hurrying(Protocol):
    """A handler that can be told notices wait for it (see :meth:`Serialized.handle`)."""

    def handle(self, notices: Sequence[Notice], *, hurry: Callable[[], bool] | None = None) -> Sequence[object]: ...

    def anything_to_reconcile(self) -> bool: ...

    def reconcile(self, *, looked: bool = False, hurry: Callable[[], bool] | None = None) -> None: ...

    def flush(self, timeout: float | None = None) -> None: ...


class Looking(Protocol):
    """A handler whose reconcile can be told its caller looked already (see
    :meth:`Serialized.reconcile`)."""

    def anything_to_reconcile(self) -> bool: ...

    def reconcile(self, *, looked: bool = False) -> None: ...


@dataclass(frozen=True)
class Delivery:
    """One item of a delivery: a decoded notice (and the further notices of the same payload:
    an AWS Health event names every affected instance), or the reason there is none."""

    key: str  # the SQS message id, the CloudEvent id...: names the item in logs and answers
    notice: Notice | None = None
    error: events.EventError | None = None
    more: tuple[Notice, ...] = ()

    @property
    def notices(self) -> list[Notice]:
        return [] if self.notice is None else [self.notice, *self.more]

    @classmethod
    def decode(cls, key: str, decoder: Callable[[], Sequence[Notice]]) -> Delivery:
        """Run ``decoder`` (:func:`events.decode_all`: at least one notice); an
        :class:`events.EventError` becomes an acknowledged item."""
        try:
            decoded = decoder()
        except events.EventError as exc:
            return cls(key=key, error=exc)
        first, *rest = decoded
        return cls(key=key, notice=first, more=tuple(rest))


def deliver(handler: Handler, items: Sequence[Delivery], *, transport: str) -> list[Result]:
    """Handle ``items`` as one plan; one :class:`Result` per item, aligned with ``items``."""
    results: list[Result | None] = [None] * len(items)
    batch: list[Notice] = []
    positions: list[int] = []
    for index, item in enumerate(items):
        if item.notice is not None:
            for notice in item.notices:
                batch.append(notice)
                positions.append(index)
            continue
        error = item.error or events.Malformed("nothing to decode")
        result = Result.FOREIGN if isinstance(error, events.Foreign) else Result.MALFORMED
        results[index] = result
        telemetry.NOTICES.labels(kind="unknown", result=result.value).inc()
        telemetry.ERRORS.labels(transport=transport, error=result.value).inc()
        level = logging.INFO if result is Result.FOREIGN else logging.WARNING
        log.log(
            level,
            "acknowledged a %s message without handling it: %s",
            result.value,
            error.message,
            extra={"transport": transport, "message_id": item.key, **error.fields()},
        )
    if batch:
        handled = _handle(handler, batch, transport)
        for notice, position, result in zip(batch, positions, handled, strict=True):
            results[position] = _combined(results[position], result)
            telemetry.NOTICES.labels(kind=notice.kind.value, result=result.value).inc()
            if result is Result.DONE:
                age = (datetime.now(UTC) - notice.time).total_seconds()
                telemetry.NOTICE_AGE.labels(kind=notice.kind.value).observe(max(age, 0.0))
            log.info(
                "notice %s",
                result.value,
                extra={
                    "transport": transport,
                    "message_id": items[position].key,
                    "event_id": notice.event_id,
                    "kind": notice.kind.value,
                    "instance_id": notice.instance_id,
                    "result": result.value,
                },
            )
    return [r if r is not None else Result.RETRY for r in results]


def _combined(old: Result | None, new: Result) -> Result:
    """One item's result from its notices': a retry if any is retried, else done if any is."""
    if old is None:
        return new
    for wanted in (Result.RETRY, Result.DONE):
        if wanted in (old, new):
            return wanted
    return new


def _handle(handler: Handler, batch: list[Notice], transport: str) -> list[Result]:
    started = time.monotonic()
    try:
        outcomes = list(handler.handle(batch))
    except Exception as exc:
        telemetry.ERRORS.labels(transport=transport, error="handler").inc()
        log.exception(
            "handling %d notice(s) failed; asking for redelivery",
            len(batch),
            extra={
                "transport": transport,
                "event_ids": [n.event_id for n in batch],
                "error": type(exc).__name__,
            },
        )
        return [Result.RETRY] * len(batch)
    finally:
        telemetry.HANDLE_SECONDS.labels(transport=transport).observe(time.monotonic() - started)
    if len(outcomes) != len(batch):
        telemetry.ERRORS.labels(transport=transport, error="handler").inc()
        log.error(
            "the handler answered %d outcomes for %d notices; asking for redelivery",
            len(outcomes),
            len(batch),
            extra={"transport": transport, "event_ids": [n.event_id for n in batch]},
        )
        return [Result.RETRY] * len(batch)
    return [_result(outcome) for outcome in outcomes]


def _result(outcome: object) -> Result:
    """Map the handler's ``Outcome`` (a StrEnum: done, ignored, retry) by value."""
    value = getattr(outcome, "value", outcome)
    if value == "done":
        return Result.DONE
    if value == "ignored":
        return Result.IGNORED
    if value != "retry":
        log.error("unknown handler outcome %r; asking for redelivery", outcome)
    return Result.RETRY


def reconcile(handler: Handler, *, transport: str) -> bool:
    """Run ``handler.reconcile()``; False (logged) when it failed."""
    started = time.monotonic()
    try:
        handler.reconcile()
    except Exception as exc:
        telemetry.ERRORS.labels(transport=transport, error="reconcile").inc()
        log.exception("reconcile failed", extra={"transport": transport, "error": type(exc).__name__})
        return False
    finally:
        telemetry.RECONCILE_SECONDS.observe(time.monotonic() - started)
    telemetry.RECONCILES.inc()
    return True


class Serialized:
    """A handler shared by several threads (HTTP workers, the poller, the reconcile timer).

    One plan at a time: two plans written at once would each see the cluster
    without the other's surge. With ``ready``, each handling and reconcile is
    recorded there: a handling with a notice to retry, or one that raised, failed.

    Notices first: while a handling waits for the turn, the one holding it (a handling
    whose surges are written, or a reconcile) is told to hurry (``Hurrying``): it leaves
    its upkeep and its Events' waits to later, so that a slow API server does not make
    each notice wait for the last one's non-urgent writes.
    """

    def __init__(self, handler: Handler, ready: readiness.Readiness | None = None) -> None:
        self.handler = handler
        self.readiness = ready
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._waiting = 0  # handlings waiting for their turn
        # A handler that can hurry (spotguard.interruption.handler.Handler) is told when
        # notices wait for it: it then leaves its upkeep to the next pass.
        self._hurries = isinstance(handler, Hurrying)

    def notices_waiting(self) -> bool:
        """Whether a handling waits for the turn (the one holding it should hurry)."""
        return self._waiting > 0

    def handle(self, notices: Sequence[Notice]) -> Sequence[object]:
        with self._count_lock:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._count_lock:
                self._waiting -= 1
        try:
            try:
                if self._hurries:
                    outcomes = cast(Hurrying, self.handler).handle(notices, hurry=self.notices_waiting)
                else:
                    outcomes = self.handler.handle(notices)
            except Exception as exc:
                self._record(False, f"handling {len(notices)} notice(s) raised {type(exc).__name__}: {exc}")
                raise
        finally:
            self._lock.release()
        retries = sum(1 for o in outcomes if getattr(o, "value", o) == "retry")
        self._record(not retries, f"{retries} of {len(notices)} notice(s) to retry (see the log)")
        return outcomes

    def reconcile(self) -> None:
        """The reconcile, one at a time with the handlings. A handler that can look whether
        there is anything to reconcile (``anything_to_reconcile``: reads only) looks before
        taking its turn: a reconcile with nothing to do then never holds a notice back. The
        look is up to five lists one after another; under hung requests (each held seconds,
        then read again) an idle reconcile held the turn up to 19 s of every 15 s period, and
        a notice arriving meanwhile waited for it before its own reads (chaos aborted-drain
        under timeouts: the notice's first writes came 28 s after it, past the eviction
        guard's grace for a drainer ahead of spotguard)."""
        look = getattr(self.handler, "anything_to_reconcile", None)
        try:
            if look is not None and not look():
                self._record(True)
                return
        except Exception as exc:
            self._record(False, f"reconcile raised {type(exc).__name__}: {exc}")
            raise
        with self._lock:
            try:
                if self._hurries:
                    cast(Hurrying, self.handler).reconcile(looked=True, hurry=self.notices_waiting)
                elif look is None:
                    self.handler.reconcile()
                else:
                    cast(Looking, self.handler).reconcile(looked=True)
            except Exception as exc:
                self._record(False, f"reconcile raised {type(exc).__name__}: {exc}")
                raise
        self._record(True)

    def _record(self, ok: bool, reason: str = "") -> None:
        if self.readiness is not None:
            self.readiness.record(ok, reason[:500])


class Lazy:
    """A handler built on first use, so that a delivery holding no notice never needs the cluster.

    Building it may fail (the API server or the EKS token unreachable): then the
    notices of that delivery are retried like any transient failure, and the next
    delivery tries again.
    """

    def __init__(self, build: Callable[[], Handler]) -> None:
        self._build = build

    def handle(self, notices: Sequence[Notice]) -> Sequence[object]:
        return self._build().handle(notices)

    def reconcile(self) -> None:
        self._build().reconcile()
