"""One deadline per review, and a gateway wrapper that keeps every API call inside it.

kube-apiserver gives a webhook ``timeoutSeconds`` (3 s in the shipped
configuration) and then admits the pod unpatched (``failurePolicy: Ignore``).
An answer that comes later is thrown away, so whatever the review wrote after
that point (a reservation) would describe a pod that does not carry it. Each
review therefore runs under one :class:`Deadline`, well inside the timeout:
every API call gets at most the time that is left, no call starts once it has
passed, and a write needs :data:`WRITE_RESERVE` seconds left. A review that
runs out answers "allowed, unchanged" and writes nothing more.

The deadline travels in a :class:`contextvars.ContextVar`, so the resolver and
the reservations, which share one :class:`DeadlineKube` per process, need no
extra argument; work handed to a thread pool carries it along
(:func:`submit`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import retry
from spotguard.gateway.resources import Resource

T = TypeVar("T")
WRITE_RESERVE = 0.15  # seconds a write needs left to be started at all
# Of the caller's own timeout (kube-apiserver's ``?timeout=3s``), counted from the request's
# arrival, the share a review may use; the rest is for the answer to travel back.
CALLER_SHARE = 0.85
CALLER_TIMEOUT = 3.0  # seconds, when the caller does not say (the shipped webhook's timeoutSeconds)
_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("spotguard_deadline", default=None)
_arrival: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("spotguard_arrival", default=None)
# what the review being served decided on without a fresh answer from the API server (see
# ``noting``); a list shared by the threads the review hands work to (``submit``)
_notes: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("spotguard_degraded", default=None)


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?)(h|ms|us|\u00b5s|ns|m|s)")


class DeadlineExceeded(Exception):
    """The review's time is up: answer allowed and unchanged, write nothing more."""


@dataclasses.dataclass(frozen=True)
class Deadline:
    at: float  # time.monotonic() value

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, what: str, reserve: float = 0.0) -> float:
        """The seconds left, or :class:`DeadlineExceeded` when fewer than ``reserve`` are."""
        left = self.remaining()
        if left <= reserve:
            raise DeadlineExceeded(f"review deadline reached before {what}")
        return left


@dataclasses.dataclass(frozen=True)
class Arrival:
    """When the HTTP server saw the request (``time.monotonic()``) and the caller's timeout, if it said."""

    at: float
    timeout: float | None = None


@contextlib.contextmanager
def arrived(at: float | None = None, timeout: float | None = None) -> Iterator[Arrival]:
    """Mark the request being served as arrived at ``at`` (default: now): a review's deadline
    counts from there, so time spent queued behind a burst (accept queue, TLS handshakes,
    busy threads) is counted too."""
    a = Arrival(time.monotonic() if at is None else at, timeout)
    token = _arrival.set(a)
    try:
        yield a
    finally:
        _arrival.reset(token)


def arrival() -> Arrival | None:
    return _arrival.get()


def for_review(seconds: float) -> Deadline:
    """The deadline of the review being served: ``seconds`` of work from now, and never past
    :data:`CALLER_SHARE` of the caller's timeout counted from the request's arrival (the
    time it waited for a thread is the caller's time too)."""
    work = Deadline.after(seconds)
    a = _arrival.get()
    if a is None:
        return work
    timeout = a.timeout if a.timeout is not None else CALLER_TIMEOUT
    return Deadline(min(work.at, a.at + timeout * CALLER_SHARE))


def parse_timeout(raw: str | None) -> float | None:
    """kube-apiserver's ``?timeout=`` query parameter (a Go duration: ``3s``, ``2.5s``,
    ``1500ms``, ``1m0s``) in seconds; None when absent or not understood."""
    if not raw:
        return None
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}
    total, rest = 0.0, raw.strip()
    while rest:
        match = _DURATION.match(rest)
        if match is None:
            return None
        total += float(match.group(1)) * units[match.group(2)]
        rest = rest[match.end() :]
    return total if total > 0 else None


def current() -> Deadline | None:
    return _current.get()


def remaining(default: float = 1e9) -> float:
    d = _current.get()
    return default if d is None else d.remaining()


@contextlib.contextmanager
def running(d: Deadline) -> Iterator[Deadline]:
    token = _current.set(d)
    try:
        yield d
    finally:
        _current.reset(token)


@contextlib.contextmanager
def noting() -> Iterator[list[str]]:
    """Collect, for the review being served, what it used in place of an API answer that did
    not come in time (``note``): the review's answer is then a degraded one."""
    notes: list[str] = []
    token = _notes.set(notes)
    try:
        yield notes
    finally:
        _notes.reset(token)


def collecting() -> bool:
    """Whether the review being served takes answers other than fresh API ones (``noting``)."""
    return _notes.get() is not None


def note(how: str) -> bool:
    """The review being served decides on something other than a fresh API answer: noted,
    and True, where the review takes such answers (inside ``noting``); else False."""
    notes = _notes.get()
    if notes is None:
        return False
    if how not in notes:
        notes.append(how)
    return True


def submit(pool: futures.Executor, fn: Callable[..., T], *args: Any) -> futures.Future[T]:
    """``pool.submit`` that carries the caller's deadline into the worker thread."""
    ctx = contextvars.copy_context()
    return pool.submit(ctx.run, fn, *args)


class DeadlineKube:
    """The calls admission makes, each bounded by the current review's deadline."""

    def __init__(self, base: kube_mod.Kube, policy: retry.Policy) -> None:
        self.base = base
        self.policy = policy
        # how long the last three calls took: the fastest is what a write needs at least now
        # (a busy API server's slower answers are queueing that a write may not meet)
        self._recent: collections.deque[float] = collections.deque(maxlen=3)
        self._latency_lock = threading.Lock()

    def write_reserve(self) -> float:
        """The time a write needs left to be started: :data:`WRITE_RESERVE`, or the fastest of
        the last few calls when the API server answers slower than that now. A write started
        with less time than any call takes would land after the review gave up on it (a
        reservation for a pod admitted unchanged)."""
        with self._latency_lock:
            fastest = min(self._recent, default=0.0)
        return max(WRITE_RESERVE, fastest)

    def _timed(self, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return fn()
        finally:
            took = time.monotonic() - started
            with self._latency_lock:
                self._recent.append(took)

    def _kube(self, what: str, write: bool = False) -> kube_mod.Kube:
        """The gateway bounded by the review's remaining time: one attempt may take all of it
        (a slow but healthy API server answers late, not never: a fixed per-request timeout
        shorter than the time left only turned its late answers into failed reviews), and a
        retry after a quick failure (a 5xx, a refused connection) gets what is left then.
        A write needs :meth:`write_reserve` left."""
        d = _current.get()
        if d is None:
            return self.base
        left = d.check(what, self.write_reserve() if write else 0.0)
        return self.base.with_policy(
            dataclasses.replace(
                self.policy,
                deadline=left,
                timeout=left,
                connect_timeout=min(self.policy.connect_timeout, left),
            )
        )

    @property
    def stats(self) -> Any:
        return self.base.stats

    def find(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        kube = self._kube(f"GET {res.plural}")
        return self._timed(lambda: kube.find(res, name, namespace))

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        kube = self._kube(f"GET {res.plural}")
        return self._timed(lambda: kube.get(res, name, namespace))

    def list(self, res: Resource, namespace: str | None = None, label_selector: str | None = None) -> Any:
        kube = self._kube(f"LIST {res.plural}")
        return self._timed(lambda: kube.list(res, namespace, label_selector=label_selector))

    def create(self, res: Resource, obj: Any, namespace: str | None = None) -> Any:
        kube = self._kube(f"POST {res.plural}", write=True)
        return self._timed(lambda: kube.create(res, obj, namespace))

    def replace(self, res: Resource, obj: Any) -> Any:
        kube = self._kube(f"PUT {res.plural}", write=True)
        return self._timed(lambda: kube.replace(res, obj))

    def create_event(self, *args: Any, **kwargs: Any) -> Any:
        return self._kube("POST events", write=True).create_event(*args, **kwargs)
