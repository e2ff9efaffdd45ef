"""The simulated clock: its scale changes without a jump, and other processes can rebuild it."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from spotguard_sim import clock as clock_mod
from spotguard_sim.controllers import base


def test_a_new_scale_keeps_simulated_time_continuous() -> None:
    c = clock_mod.Clock(time_scale=1000.0, start=1_000_000.0)
    time.sleep(0.02)
    before = c.now()
    c.set_scale(1.0)
    after = c.now()
    assert before >= 1_000_000.0 + 20  # 0.02 real seconds at x1000
    assert 0 <= after - before < 5  # no jump back or forward at the change
    time.sleep(0.05)
    assert c.now() - after < 1.0  # now at x1: 0.05 real seconds are about 0.05 simulated
    assert c.time_scale == 1.0
    assert c.real(10) == 10.0


def test_advance_survives_a_scale_change() -> None:
    c = clock_mod.Clock(time_scale=1.0, start=0.0)
    c.advance(100)
    c.set_scale(50.0)
    assert 100 <= c.now() < 101


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_scale_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        clock_mod.Clock(time_scale=bad)
    with pytest.raises(ValueError, match="positive"):
        clock_mod.Clock().set_scale(bad)


def test_the_spec_rebuilds_the_same_clock() -> None:
    c = clock_mod.Clock(time_scale=20.0, start=5_000.0)
    c.advance(7)
    c.set_scale(3.0)
    copy = clock_mod.Clock.from_spec(c.spec())
    assert copy.time_scale == 3.0
    assert abs(copy.now() - c.now()) < 0.01


def test_readers_never_see_time_go_back_while_the_scale_changes() -> None:
    c = clock_mod.Clock(time_scale=20.0, start=0.0)
    stop = threading.Event()
    backwards: list[tuple[float, float]] = []

    def read() -> None:
        last = c.now()
        while not stop.is_set():
            now = c.now()
            if now < last:
                backwards.append((last, now))
            last = now

    readers = [threading.Thread(target=read) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: every race gets its chance
    try:
        for r in readers:
            r.start()
        for i in range(20_000):
            c.set_scale(0.5 if i % 2 else 400.0)
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        for r in readers:
            r.join()
    assert backwards == []


def _get_within(queue: base.WorkQueue, real_seconds: float) -> object:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(queue.get()), daemon=True)
    t.start()
    t.join(real_seconds)
    queue.shutdown()
    t.join(2)
    return got[0] if got else None


def test_a_delayed_key_comes_at_its_simulated_time_when_the_clock_speeds_up() -> None:
    c = clock_mod.Clock(time_scale=1.0)
    q = base.WorkQueue(c)
    q.add_after("k", 30.0)  # 30 real seconds at x1
    c.set_scale(1000.0)  # now 0.03
    assert _get_within(q, 2.0) == "k"


def test_a_delayed_key_waits_its_simulated_time_when_the_clock_slows_down() -> None:
    c = clock_mod.Clock(time_scale=1000.0)
    q = base.WorkQueue(c)
    q.add_after("k", 100.0)  # 0.1 real seconds at x1000
    c.set_scale(1.0)  # now about 100 real seconds
    assert _get_within(q, 0.5) is None
