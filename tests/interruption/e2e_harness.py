"""Drive the interruption handler against the simulated cluster and watch what the workloads go through.

``Watcher`` (:class:`spotguard_sim.readiness.Tracker`) subscribes to the simulated
store and keeps, for every workload, the number of Ready pods after every change
(so a dip between two polls is seen), the lowest it fell to, and the Ready count
away from the doomed nodes at the moment each doomed node goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from spotguard.admission import registration
from spotguard.gateway import kube
from spotguard.interruption.handler import Handler, Outcome
from spotguard.policy import config, floors
from spotguard.policy.notices import Notice, NoticeKind
from spotguard.policy.workloads import Workload
from spotguard_sim import readiness

from tests.interruption import sim_scenario

Obj = dict[str, Any]


# The readiness tracker lives in the package: the demo uses it too.
Watcher = readiness.Tracker
workload_key = readiness.workload_key
is_ready = readiness.is_ready


def wait_until(what: Callable[[], bool], timeout: float, message: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")


def ready_pods(store: Any) -> int:
    return sum(1 for p in store.list("pods")[0] if is_ready(p))


def start_mixed_workloads(store: Any) -> dict[str, tuple[int, int]]:
    """Apply ``sim_scenario.mixed_workloads()`` and wait until every pod of them is Ready;
    their :func:`floors_of` then."""
    workloads = sim_scenario.mixed_workloads()
    store.apply_objects(workloads)
    count = sum(1 for o in workloads if o["kind"] in ("Deployment", "StatefulSet"))
    wait_until(lambda: len(floors_of(store)) == count, 5, "the workloads")
    before = floors_of(store)
    total = sum(replicas for replicas, _ in before.values())
    wait_until(lambda: ready_pods(store) == total, 30, "every pod Ready")
    return before


def notices_for(
    sim: Any, nodes: Sequence[str], kind: NoticeKind = NoticeKind.INTERRUPTION, state: str = ""
) -> list[Notice]:
    t = datetime.fromtimestamp(sim.clock.now(), UTC)
    prefix = {NoticeKind.INTERRUPTION: "itn", NoticeKind.REBALANCE: "rbl", NoticeKind.STATE_CHANGE: "stc"}[kind]
    return [
        Notice(
            event_id=f"{prefix}-{n}",
            kind=kind,
            instance_id=sim_scenario.instance_id(n),
            time=t,
            state=state,
            action="terminate" if kind is NoticeKind.INTERRUPTION else "",
            region="us-east-1",
            account="123456789012",
        )
        for n in nodes
    ]


def deliver(handler: Handler, notices: Sequence[Notice], max_rounds: int = 40, pause: float = 0.05) -> int:
    """Deliver like SQS: redeliver what came back RETRY until all are acknowledged; return the rounds."""
    pending = list(notices)
    for rounds in range(1, max_rounds + 1):
        outcomes = handler.handle(pending)
        assert len(outcomes) == len(pending)
        pending = [n for n, o in zip(pending, outcomes, strict=True) if o is Outcome.RETRY]
        if not pending:
            return rounds
        time.sleep(pause)
    raise AssertionError(f"{len(pending)} notices still not handled after {max_rounds} deliveries")


def handler_for(sim: Any, **kw: Any) -> Handler:
    k = kube.Kube(sim.api_client())
    return Handler(k, kw.pop("config", config.Config()), clock=sim.clock.now, **kw)


def workloads(store: Any) -> dict[str, Workload]:
    """key -> every Deployment and StatefulSet now."""
    out = {}
    for res, kind in (("deployments", "Deployment"), ("statefulsets", "StatefulSet")):
        for obj in store.list(res)[0]:
            obj.setdefault("kind", kind)
            w = Workload.from_json(obj)
            out[w.key] = w
    return out


def floors_of(store: Any) -> dict[str, tuple[int, int]]:
    """key -> (replicas, on-demand floor) of every workload now."""
    cfg = config.Config()
    return {key: (w.replicas, floors.floor_for(w, cfg).on_demand) for key, w in workloads(store).items()}


@contextlib.contextmanager
def admission_webhook(
    sim: Any, workdir: str | os.PathLike[str], *, pods: bool = True, evictions: bool = False,
    timing: Any = None, timeout_seconds: int | None = 5,
) -> Iterator[str]:
    """Serve the admission function over HTTPS on loopback and register it with the cluster.

    Yields the webhook's URL. ``pods``: pods created after this are placed by spotguard's
    admission (the shipped MutatingWebhookConfiguration). ``evictions``: the shipped eviction
    guard (ValidatingWebhookConfiguration for pods/eviction) is registered too, deciding on
    the simulated clock (``timing``: its grace and release, in simulated seconds; its reads of
    the nodes it has sighted as often in simulated time as in production).
    ``timeout_seconds``: the webhooks' timeout (None: as shipped).
    """
    from spotguard import certs
    from spotguard.admission import app as admission_app
    from spotguard.admission import core
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    paths = certs.make(workdir, ["localhost"], ["127.0.0.1"])
    sim.store.apply_objects([sim_scenario.namespace("spotguard")])
    ctx = core.Context(config.Config(), kube.Kube(sim.api_client()))
    # The admission caches the workload for 2 s of real time; the simulated cluster runs
    # time_scale times faster, so scale its caches the same way (else 2 s spans 40 s here).
    scale = max(1.0, float(sim.clock.time_scale))
    ctx.resolver.workload_ttl /= scale
    ctx.resolver.node_ttl /= scale
    server = make_server(
        "127.0.0.1", 0, admission_app.create_app(ctx), threaded=True, ssl_context=(str(paths.cert), str(paths.key))
    )
    thread = threading.Thread(target=server.serve_forever, name="admission-webhook", daemon=True)
    thread.start()
    base = f"https://127.0.0.1:{server.server_port}"
    url = f"{base}/mutate"
    if evictions:
        from spotguard.admission import evictions as guard
        from spotguard.admission import sightings

        refresh = sightings.REFRESH_SECONDS / scale
        guard.configure(ctx, guard.Guard(clock=sim.clock.now, timing=timing, refresh=refresh))
    # The shipped webhook configurations; by default a longer timeout for a loaded test machine.
    overrides = {} if timeout_seconds is None else {"timeoutSeconds": timeout_seconds}
    registration.register(sim.store, base, paths.ca_bundle, pods=pods, evictions=evictions, **overrides)
    try:
        yield url
    finally:
        server.shutdown()
        thread.join(5)
