"""The three functions, run for a local cycle as production runs them.

- :func:`admission_server`: ``spotguard serve admission`` in a child process
  (gunicorn, HTTPS with a fresh CA), registered with the cluster through the
  shipped webhook configuration (:mod:`spotguard.admission.registration`).
- :func:`interruption_poller`: the spot-interruption function's SQS poller and
  its scheduled reconcile, as ``spotguard serve spot-interruption
  --sqs-queue-url`` runs them, on the simulated cluster's clock (so that its
  surge ages agree with the simulated time).
- :func:`node_added`: the node-added function's HTTP app on loopback (on the
  simulated clock) behind one small seam, :class:`NodeAdded`: the cycle tells it
  that nodes joined (Knative ApiServerSource ``dev.knative.apiserver.resource.add``
  CloudEvents) and pings it (PingSource), and it moves workloads back to spot.
  Where this spotguard has no node-added function, the seam says so and the
  phase is skipped.

Every child process is stopped on exit, also on SIGINT/SIGTERM (see
:mod:`spotguard.ops.signals`); only a SIGKILL of the parent leaves one behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from spotguard import certs
from spotguard.admission import registration
from spotguard.gateway import settings
from spotguard.logs import UserError

Obj = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: Callable[[], bool], timeout: float, message: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(step)
    raise UserError(f"timed out after {timeout:.0f}s waiting for {message}")


@contextlib.contextmanager
def child(
    cmd: list[str], log_path: Path, stop_signal: int = signal.SIGTERM, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process that gets ``stop_signal`` (then SIGKILL) on exit."""
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(stop_signal)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


@dataclass
class Admission:
    url: str
    proc: subprocess.Popen[bytes]
    # how long it keeps a workload it read (real seconds): node-added's moves wait for it
    workload_cache_seconds: float = 2.0

    def stop_soon(self) -> None:
        """Ask the server to stop now (its exit is awaited when its ``with`` block ends)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)


@contextlib.contextmanager
def admission_server(
    sim: Any, workdir: Path, workers: int = 1, time_scale: float = 1.0, log_level: str = "WARNING"
) -> Iterator[Admission]:
    """``spotguard serve admission`` over HTTPS, registered as the cluster's webhooks: the
    pod-create webhook and the eviction guard (``pods/eviction``).

    The private keys are written under ``workdir``, which the caller removes; its log
    (at ``log_level``) is ``workdir/admission.log``.
    """
    paths = certs.make(workdir / "certs", ["localhost"], ["127.0.0.1"])
    port = free_port()
    cmd = [
        sys.executable, "-m", "spotguard.cli", "--log-level", log_level, "serve", "admission",
        "--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
        "--kubeconfig", sim.kubeconfig, "--workers", str(workers),
    ]  # fmt: skip
    # SIGINT: gunicorn's quick shutdown (SIGTERM waits for the cluster's pooled keep-alive connections).
    # The child measures the eviction guard's no-notice grace and floor hold, and how long it keeps
    # a workload it read, on its own (real) clock: scaled, they last what they last in production
    # in simulated time (unscaled, the cache would lag the simulated cluster 20-fold at x20).
    env = {name: os.environ.get(name, f"{seconds / max(time_scale, 1.0):.3f}") for name, seconds in (
        ("SPOTGUARD_EVICTION_GRACE_SECONDS", 8.0), ("SPOTGUARD_EVICTION_FLOOR_HOLD_SECONDS", 300.0),
        (settings.WORKLOAD_CACHE_ENV, settings.WORKLOAD_CACHE_SECONDS))}  # fmt: skip
    with child(cmd, workdir / "admission.log", signal.SIGINT, env=env) as proc:
        context = ssl.create_default_context(cafile=str(paths.ca_cert))
        health = f"https://localhost:{port}/healthz"
        wait_until(lambda: _healthy(health, context, proc, workdir / "admission.log"), 60, "the admission webhook")
        registration.register(sim.store, f"https://localhost:{port}", paths.ca_bundle)
        yield Admission(f"https://localhost:{port}/mutate", proc, settings.workload_cache_seconds(env))


def _healthy(url: str, context: ssl.SSLContext | None, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        raise UserError(f"the {url.split('/')[2]} server exited with code {proc.returncode}: {tail}")
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def interruption_poller(
    sim: Any, queue_client: Any, queue_url: str, reconcile_every: Callable[[], float], cfg: Any = None
) -> Iterator[Any]:
    """The spot-interruption poller and scheduled reconcile on ``queue_url``; yields the handler.

    ``reconcile_every()``: real seconds to the next reconcile (the simulated clock's scale may change);
    ``cfg``: its settings (default: the defaults)."""
    from spotguard.gateway import kube
    from spotguard.interruption import dispatch
    from spotguard.interruption.handler import Handler
    from spotguard.interruption.poller import Poller
    from spotguard.policy import config

    handler = dispatch.Serialized(Handler(kube.Kube(sim.api_client()), cfg or config.Config(), clock=sim.clock.now))
    poller = Poller(queue_client, queue_url, handler, wait_seconds=1, retry_delay=1)
    stop = threading.Event()

    def reconcile() -> None:
        while not stop.wait(reconcile_every()):
            dispatch.reconcile(handler, transport="schedule")

    threads = [
        threading.Thread(target=poller.run, name="sqs-poller", daemon=True),
        threading.Thread(target=reconcile, name="reconcile", daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        yield handler
    finally:
        stop.set()
        poller.stop()
        for t in threads:
            t.join(60)  # a handling in flight finishes (a big plan on a busy machine takes a while)


# -- node-added ------------------------------------------------------------------------------


class NodeAdded(Protocol):
    """What the cycle needs of the node-added function."""

    available: bool
    why: str  # where not available: why, in a sentence

    def node_added(self, node: Obj) -> None: ...

    def ping(self) -> None: ...


class Unavailable:
    available = False

    def __init__(self, why: str) -> None:
        self.why = why

    def node_added(self, node: Obj) -> None:
        pass

    def ping(self) -> None:
        pass


# The shipped schedules of the node-added function: PingSource "* * * * *", EventBridge
# Scheduler rate(1 minute), the in-cluster timer's reconcileIntervalSeconds 60 (simulated seconds).
SCHEDULE_SECONDS = 60.0


class Deliveries:
    """What the node-added function is sent, as the shipped wiring sends it: a ping every
    ``every`` simulated seconds (the schedule) and an ApiServerSource add event for each node
    that joins (Karpenter's and the Cluster Autoscaler's launches included). Call :meth:`tick`
    from a poll."""

    def __init__(self, sim: Any, node_added: NodeAdded, every: float = SCHEDULE_SECONDS) -> None:
        self.sim = sim
        self.node_added = node_added
        self.every = every
        self.last_ping = sim.clock.now() - every  # the first tick pings
        self.known = {str(n["metadata"]["name"]) for n in sim.store.list("nodes")[0]}

    def tick(self) -> None:
        nodes = self.sim.store.list("nodes")[0]
        for n in nodes:
            name = str(n["metadata"]["name"])
            if name not in self.known:
                self.known.add(name)
                self.node_added.node_added(n)
        now = self.sim.clock.now()
        if now - self.last_ping >= self.every:
            self.last_ping = now
            self.node_added.ping()


class CloudEventsNodeAdded:
    """Sends the served node-added function what Knative would: ApiServerSource adds and pings.

    Delivered in order by one sender thread, as a broker delivers them (each may run a
    whole pass): :meth:`node_added` and :meth:`ping` return at once; a ping is dropped
    while deliveries are still queued (the next pass sees the same cluster anyway).
    """

    available = True
    why = ""

    def __init__(self, url: str, api_server: str) -> None:
        self.url = url
        self.api_server = api_server
        self.queue: queue.Queue[tuple[dict[str, str], object] | None] = queue.Queue()
        self.delivered = 0
        self.failed = 0
        self._sender = threading.Thread(target=self._send_all, name="node-added-events", daemon=True)
        self._sender.start()

    def close(self) -> None:
        """Drop what is queued; wait for the delivery in flight."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        self.queue.put(None)
        self._sender.join(60)

    def _send_all(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self._post(*item)
                self.delivered += 1
            except OSError:
                self.failed += 1

    def node_added(self, node: Obj) -> None:
        name = str((node.get("metadata") or {}).get("name"))
        self.queue.put(
            (
                {
                    "ce-type": "dev.knative.apiserver.resource.add",
                    "ce-source": self.api_server,
                    "ce-subject": f"/api/v1/nodes/{name}",
                    "ce-kind": "Node",
                    "ce-name": name,
                    "ce-apiversion": "v1",
                },
                node,
            )
        )

    def ping(self) -> None:
        if not self.queue.empty():
            return
        self.queue.put(
            (
                {
                    "ce-type": "dev.knative.sources.ping",
                    "ce-source": "/apis/v1/namespaces/spotguard/pingsources/spotguard-reconcile",
                },
                {"spotguard": "reconcile"},
            )
        )

    def _post(self, headers: dict[str, str], data: object) -> None:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(data).encode(),
            method="POST",
            headers={
                "ce-specversion": "1.0",
                "ce-id": str(uuid.uuid4()),
                "ce-time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "content-type": "application/json",
                **headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:  # transient: Knative would retry; the next ping does
                return
            raise


def has_node_added() -> bool:
    """Whether this spotguard carries the node-added function (``spotguard serve node-added``)."""
    return importlib.util.find_spec("spotguard.nodeadded") is not None


@contextlib.contextmanager
def node_added(
    sim: Any,
    workdir: Path,
    cfg: Any = None,
    admission_cache_seconds: float | None = None,
    *,
    workload_cache_seconds: float | None = None,
) -> Iterator[NodeAdded]:
    """The node-added function's HTTP app (what ``spotguard serve node-added`` serves) on loopback.

    In the cycle's process, on the simulated clock: its hold and settle windows read pod
    ages from creationTimestamps the simulated cluster writes, so its clock must be the
    cluster's. Where this spotguard has no node-added function: :class:`Unavailable`.
    ``cfg``: its settings (default: the defaults); ``admission_cache_seconds``: how long a move
    waits for the admission webhook's cached workloads (default: as in production, or from
    ``workload_cache_seconds``, how long the webhook keeps them: :attr:`Admission.workload_cache_seconds`).
    """
    if not has_node_added():
        yield Unavailable("this spotguard has no node-added function yet (spotguard.nodeadded)")
        return
    from werkzeug.serving import make_server

    from spotguard.gateway import kube
    from spotguard.nodeadded import app, reconciler, service
    from spotguard.policy import config

    k = kube.Kube(sim.api_client())
    wait = reconciler.ADMISSION_CACHE_SECONDS if admission_cache_seconds is None else admission_cache_seconds
    if admission_cache_seconds is None and workload_cache_seconds is not None:
        wait = workload_cache_seconds + reconciler.READ_IN_FLIGHT_SECONDS
    svc = service.Service(
        lambda: reconciler.Reconciler(
            k, cfg or config.Config(), clock=sim.clock.now, admission_cache_seconds=wait
        ),
        join_wait=max(2.0, 60.0 / sim.clock.time_scale),
        poll=0.05,
        # moves in flight are followed as in production (every 10 s for 90 s), on the cluster's clock
        follow_sleep=sim.clock.sleep,
        follow_clock=sim.clock.now,
    )
    server = make_server("127.0.0.1", 0, app.create_app(svc), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="node-added", daemon=True)
    thread.start()
    sender = CloudEventsNodeAdded(f"http://127.0.0.1:{server.server_port}/", sim.url)
    try:
        yield sender
    finally:
        sender.close()
        server.shutdown()
        thread.join(10)
