"""The API server's clock, as its answers' ``Date`` headers tell it.

Timestamps in the cluster (``creationTimestamp``, conditions) are written on the API
server's clock; a function comparing them to its own clock would be off by the skew
between the two (a Lambda's or a node's clock is not the control plane's). Every answer
carries a ``Date`` header (Go's net/http sets it: RFC 9110 section 6.6.1); :class:`ServerClock`
keeps the offset the last one showed, and :meth:`ServerClock.now` is the local time moved
by it (one-second resolution, the header's). Without any ``Date`` seen, the local time.
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable


class ServerClock:
    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self._local = local
        self._offset = 0.0
        self._lock = threading.Lock()
        self.seen = False  # a Date header was read

    def observe(self, date: str | None, received: float | None = None) -> None:
        """A ``Date`` header of an answer that arrived at ``received`` (local seconds; now)."""
        if not date:
            return
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        # The header is whole seconds, cut down: the server's time was within [server, server + 1).
        offset = server + 0.5 - (self._local() if received is None else received)
        with self._lock:
            self._offset, self.seen = offset, True

    @property
    def offset(self) -> float:
        """Server seconds minus local seconds, as last seen (0 before any)."""
        return self._offset

    def now(self) -> float:
        """The API server's epoch seconds now."""
        return self._local() + self._offset
