"""Simulated time: real time, optionally running ``time_scale`` times faster."""

from __future__ import annotations

import datetime
import threading
import time


class Clock:
    """Simulated epoch seconds that advance ``time_scale`` times faster than real time."""

    def __init__(self, time_scale: float = 1.0, start: float | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.time_scale = float(time_scale)
        self._real0 = time.monotonic()
        self._sim0 = time.time() if start is None else float(start)
        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        """Simulated epoch seconds."""
        return self._sim0 + self._offset + (time.monotonic() - self._real0) * self.time_scale

    def real(self, sim_seconds: float) -> float:
        """How many real seconds ``sim_seconds`` of simulated time take."""
        return max(0.0, sim_seconds) / self.time_scale

    def sleep(self, sim_seconds: float) -> None:
        """Sleep for ``sim_seconds`` of simulated time."""
        time.sleep(self.real(sim_seconds))

    def advance(self, sim_seconds: float) -> None:
        """Jump simulated time forward (tests)."""
        with self._lock:
            self._offset += max(0.0, sim_seconds)

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
