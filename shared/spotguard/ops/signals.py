"""SIGTERM unwinds like Ctrl-C, so every ``with`` block stops what it started.

Python turns SIGINT into :class:`KeyboardInterrupt`; a SIGTERM would kill the
process at once and leave child processes and temporary private keys behind.
:func:`terminate_as_interrupt` raises :class:`KeyboardInterrupt` on SIGTERM too
(in the main thread), for the duration of a command.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
