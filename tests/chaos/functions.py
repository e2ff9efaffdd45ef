"""The functions as they run in production, against the simulated cluster and moto's SQS.

- the spot-interruption process: what ``spotguard serve spot-interruption
  --sqs-queue-url URL`` runs (the SQS poller and a reconcile every 15 s around
  one serialized handler), on threads of the test process, or as a separate
  process (``python -m tests.chaos.functions``) that a test can kill;
- node-added on its schedule (a PingSource every minute), each delivery following the
  moves it leaves in flight, as the served function does.

Every period is simulated time: the handler and the reconciler read the
simulated clock, and the schedules sleep ``period / time_scale`` real seconds.
SQS keeps real time; its visibility timeout and retry delay are given in real
seconds (see ``harness``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spotguard.gateway import kube, retry
from spotguard.interruption import dispatch
from spotguard.interruption.handler import Handler
from spotguard.interruption.poller import Poller
from spotguard.nodeadded import reconciler, service, triggers
from spotguard.policy import config as config_mod
from spotguard_sim import clock as clock_mod

log = logging.getLogger("tests.chaos")

INTERRUPTION_RECONCILE_SECONDS = 15.0  # `spotguard serve spot-interruption --reconcile-interval` default
NODE_ADDED_SECONDS = 60.0  # the PingSource / EventBridge schedule
POLL_WAIT_SECONDS = 1  # SQS long poll (production: 20; shorter so a test stops quickly)


@dataclass(frozen=True)
class SimulatedTimePolicy(retry.Policy):
    """The gateway's retry policy against a server whose clock runs ``time_scale`` times
    faster than real time: its ``Retry-After`` is in its (simulated) seconds. A 429's
    ``Retry-After: 1`` honoured as one real second would cost 20 simulated seconds at 20x,
    twenty times what it costs against a real API server (with 20 % 429s one handling took
    the whole two-minute notice, and the notices queued behind it came after the reclaim).
    The client's own backoff stays in real seconds (harsher than real, by the time scale)."""

    time_scale: float = 1.0

    def delay(self, retry_number: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        hint = None if retry_after is None else retry_after / self.time_scale
        return super().delay(retry_number, hint, rng)


def in_simulated_time(policy: retry.Policy, time_scale: float) -> SimulatedTimePolicy:
    """``policy`` against the simulated cluster (its Retry-After in simulated seconds)."""
    fields = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name != "time_scale"}
    return SimulatedTimePolicy(**fields, time_scale=time_scale)


def scaled_policy(time_scale: float) -> retry.Policy:
    """The gateway's retry policy with its per-request timeout in simulated time (10 s, at
    least 1 real second), so an API request that hangs costs what it would in a real cluster,
    and the server's Retry-After in simulated seconds (:class:`SimulatedTimePolicy`)."""
    timeout = max(1.0, retry.DEFAULT.timeout / time_scale)
    return SimulatedTimePolicy(
        timeout=timeout, deadline=max(3.0, retry.DEFAULT.deadline / time_scale), time_scale=time_scale
    )


@dataclass
class Schedule:
    """Call ``what`` every ``period`` simulated seconds on a thread until stopped; count failures."""

    name: str
    what: Callable[[], Any]
    period: float
    time_scale: float
    failures: list[str] = field(default_factory=list)
    runs: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Schedule:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period / self.time_scale):
            try:
                self.what()
            except Exception as exc:  # the schedule runs again, as a PingSource would
                self.failures.append(f"{type(exc).__name__}: {exc}")
                log.info("%s failed; the schedule runs again", self.name, exc_info=True)
            self.runs += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)


class InterruptionProcess:
    """``spotguard serve spot-interruption --sqs-queue-url``: poller + reconcile, one handler."""

    def __init__(
        self,
        k: kube.Kube,
        cfg: config_mod.Config,
        clock: Callable[[], float],
        sqs: Any,
        queue_url: str,
        *,
        time_scale: float,
        visibility: int,
        retry_delay: int,
    ) -> None:
        self.handler = Handler(k, cfg, clock=clock)
        serialized = dispatch.Serialized(self.handler)
        self.poller = Poller(
            sqs,
            queue_url,
            serialized,
            wait_seconds=POLL_WAIT_SECONDS,
            visibility_timeout=visibility,
            retry_delay=retry_delay,
        )
        self.reconcile = Schedule(
            "interruption-reconcile",
            lambda: dispatch.reconcile(serialized, transport="schedule"),
            INTERRUPTION_RECONCILE_SECONDS,
            time_scale,
        )
        self._thread = threading.Thread(target=self.poller.run, name="sqs-poller", daemon=True)

    def start(self) -> InterruptionProcess:
        self._thread.start()
        self.reconcile.start()
        return self

    def stop(self) -> None:
        self.poller.stop()
        self.reconcile.stop()
        self._thread.join(60)


def node_added(k: kube.Kube, cfg: config_mod.Config, clock: Callable[[], float], time_scale: float) -> Schedule:
    """node-added as its PingSource delivers to it: a delivery a minute, each a pass that then
    follows the moves it left in flight (``service.Service``: a pass every 10 s for up to 90 s
    from the delivery's start, on the simulated clock), as the shipped function runs."""
    svc = service.Service(
        lambda: reconciler.Reconciler(k, cfg, clock=clock),
        owner=None,
        follow_sleep=lambda seconds: time.sleep(seconds / time_scale),
        follow_clock=clock,
    )
    ping = triggers.Trigger(triggers.Kind.SCHEDULE, "chaos-ping", detail="ping")
    return Schedule("node-added", lambda: svc.handle(ping), NODE_ADDED_SECONDS, time_scale)


# -- as a separate process -------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The spot-interruption process on its own, reading the simulated clock of its parent
    (``--clock``: :meth:`spotguard_sim.clock.Clock.spec`)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--clock", required=True)
    parser.add_argument("--visibility", type=int, required=True)
    parser.add_argument("--retry-delay", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    sim_clock = clock_mod.Clock.from_spec(args.clock)
    clock, scale = sim_clock.now, sim_clock.time_scale

    import boto3

    proc = InterruptionProcess(
        kube.connect(args.kubeconfig, policy=scaled_policy(scale)),
        config_mod.Config(),
        clock,
        boto3.client("sqs"),
        args.queue_url,
        time_scale=scale,
        visibility=args.visibility,
        retry_delay=args.retry_delay,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    proc.start()
    print("ready", flush=True)
    stop.wait()
    proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
