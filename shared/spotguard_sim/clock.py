"""Simulated time: real time, optionally running ``time_scale`` times faster."""

from __future__ import annotations

import datetime
import threading
import time


class Clock:
    """Simulated epoch seconds that advance ``time_scale`` times faster than real time.

    The scale can change while the clock runs (:meth:`set_scale`: the demo slows the
    phases this machine could not simulate faithfully at full speed); simulated time
    stays continuous and never goes back: a reading and a change are serialised.
    """

    def __init__(self, time_scale: float = 1.0, start: float | None = None) -> None:
        _check(time_scale)
        sim0 = time.time() if start is None else float(start)
        self._base = (sim0, time.monotonic(), float(time_scale))  # (simulated, real, scale) at the last change
        self._lock = threading.Lock()

    @property
    def time_scale(self) -> float:
        return self._base[2]

    def now(self) -> float:
        """Simulated epoch seconds."""
        with self._lock:
            sim0, real0, scale = self._base
            return sim0 + (time.monotonic() - real0) * scale

    def real(self, sim_seconds: float) -> float:
        """How many real seconds ``sim_seconds`` of simulated time take (at the current scale)."""
        return max(0.0, sim_seconds) / self.time_scale

    def sleep(self, sim_seconds: float) -> None:
        """Sleep for ``sim_seconds`` of simulated time."""
        time.sleep(self.real(sim_seconds))

    def advance(self, sim_seconds: float) -> None:
        """Jump simulated time forward (tests)."""
        with self._lock:
            sim0, real0, scale = self._base
            self._base = (sim0 + max(0.0, sim_seconds), real0, scale)

    def set_scale(self, time_scale: float) -> None:
        """Run ``time_scale`` times faster than real time from now on (simulated time does not jump)."""
        _check(time_scale)
        with self._lock:
            real = time.monotonic()
            sim0, real0, scale = self._base
            self._base = (sim0 + (real - real0) * scale, real, float(time_scale))

    def spec(self) -> str:
        """``sim0,real0,scale``: another process on this machine rebuilds the clock with
        :meth:`from_spec` (CLOCK_MONOTONIC is shared by every process); a later
        :meth:`set_scale` does not reach it."""
        return ",".join(repr(x) for x in self._base)

    @classmethod
    def from_spec(cls, spec: str) -> Clock:
        sim0, real0, scale = (float(x) for x in spec.split(","))
        clock = cls(scale)
        clock._base = (sim0, real0, scale)
        return clock

    def iso(self, t: float | None = None) -> str:
        """RFC 3339 UTC with second precision, as Kubernetes prints timestamps."""
        when = self.now() if t is None else t
        return datetime.datetime.fromtimestamp(int(when), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def iso_micro(self, t: float | None = None) -> str:
        """RFC 3339 UTC with microseconds (Lease ``renewTime`` style MicroTime)."""
        when = self.now() if t is None else t
        return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )


def _check(time_scale: float) -> None:
    if not time_scale > 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")


def parse_iso(value: str) -> float:
    """Parse an RFC 3339 timestamp ("2026-11-25T21:00:00Z") into epoch seconds."""
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not an RFC 3339 time: {value!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()
