"""Measure the race between spotguard and a drainer that acts 0 to 2 s after the notice.

The simulated cluster runs in real time (time scale 1) with its drainer on (as
aws-node-termination-handler without cordon-only: cordon and evict everything
through the Eviction API, retrying a 429 every 5 s). Two Deployments without
budgets of their own (web: 6, api: 3) and one with its own permissive budget
(shop: 4, minAvailable 2) run on two on-demand and two spot nodes; pods take 3 s
to be Ready. For each run, both spot nodes get their interruption warning at t0
and:

- ``spotguard-first``: spotguard receives the notice at t0 while the drainer starts
  at t0 + U(0, 2) s;
- ``drainer-first``: the drainer starts at t0 while the notice reaches spotguard at
  t0 + U(0, 2) s;

each with ``protection``: ``none`` (the notice handler only), ``guard`` (the
eviction guard too: the admission function served over HTTPS and registered
from the shipped ValidatingWebhookConfiguration for pods/eviction), or
``rebalance`` (no guard; a rebalance recommendation, ``rebalance_action: surge``,
handled before t0, its surge Ready). ``below`` is, per Deployment, how many
SERVING pods (Ready, on a running instance) it lost at worst against its count
just before the notice (0: the promise held); ``drained_at`` when the doomed
nodes had no pod left (the reclaim is at 120 s).

Prints ONE JSON line::

    .venv/bin/python bench/drainer_race.py [--seeds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from spotguard import certs
from spotguard.admission import app as admission_app
from spotguard.admission import core, evictions, registration
from spotguard.gateway import kube
from spotguard.interruption.handler import Handler
from spotguard.policy import config
from spotguard.policy.notices import Notice, NoticeKind
from spotguard_sim import objects, readiness, testing
from spotguard_sim.controllers import drainer, nodes

READY_DELAY = 3.0


def scenario() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [objects.namespace("shop"), objects.namespace("spotguard")]
    for i, cap in enumerate(["on-demand", "on-demand", "spot", "spot"]):
        name = f"{'od' if cap == 'on-demand' else 'spot'}-{i}"
        out.append(
            objects.node(name, cap, cpu="16", provider=objects.provider_id("us-east-1a", objects.instance_id(name)))
        )
    out.append(objects.deployment("web", 6, namespace="shop"))
    out.append(objects.deployment("api", 3, namespace="shop"))
    out.append(objects.deployment("shop", 4, namespace="shop"))
    out.append(objects.pdb("shop", "shop", namespace="shop", min_available=2))
    return out


@contextlib.contextmanager
def eviction_guard(sim: Any) -> Iterator[None]:
    """The admission function over HTTPS on loopback, registered as the shipped eviction guard."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        paths = certs.make(tmp, ["localhost"], ["127.0.0.1"])
        ctx = core.Context(config.Config(), kube.Kube(sim.api_client()))
        evictions.configure(ctx, evictions.Guard(clock=sim.clock.now))
        server = make_server("127.0.0.1", 0, admission_app.create_app(ctx), threaded=True,
                             ssl_context=(str(paths.cert), str(paths.key)))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        sim.store.create("validatingwebhookconfigurations", registration.eviction_webhook_configuration(
            f"https://127.0.0.1:{server.server_port}/evictions", paths.ca_bundle))
        try:
            yield
        finally:
            server.shutdown()
            thread.join(5)


def notices(sim: Any, names: list[str], kind: NoticeKind, prefix: str) -> list[Notice]:
    t = datetime.fromtimestamp(sim.clock.now(), UTC)
    return [
        Notice(
            f"{prefix}-{n}",
            kind,
            objects.instance_id(n),
            t,
            action="terminate" if kind is NoticeKind.INTERRUPTION else "",
        )
        for n in names
    ]


def ready(store: Any) -> dict[str, int]:
    return readiness.ready_counts(store.list("pods")[0])


def wait(what: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.05)
    return False


def run(order: str, protection: str, delay: float) -> dict[str, Any]:
    cfg = dataclasses.replace(config.Config(), rebalance_action=config.RebalanceAction.SURGE)
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(
            testing.running_cluster(scenario(), time_scale=1.0, ready_delay_seconds=READY_DELAY, drainer=True)
        )
        if protection == "guard":
            stack.enter_context(eviction_guard(sim))
        store = sim.store
        wait(lambda: sum(ready(store).values()) == 13, 60)
        handler = Handler(kube.Kube(sim.api_client()), cfg, clock=sim.clock.now)
        spot = ["spot-2", "spot-3"]
        before = ready(store)  # before any notice: the serving count to keep
        if protection == "rebalance":
            handler.handle(notices(sim, spot, NoticeKind.REBALANCE, "rbl"))
            wait(
                lambda: (
                    sum(ready(store).values())
                    >= 13 + sum(1 for p in store.list("pods")[0] if p["spec"].get("nodeName") in spot)
                ),
                60,
            )
        tracker = readiness.Tracker()
        tracker.start(store)
        tracker.arm(spot)
        t0 = sim.clock.now()
        drain_at = t0 + (delay if order == "spotguard-first" else 0.0)

        def mark(node: dict[str, Any]) -> None:
            ann = node["metadata"].setdefault("annotations", {})
            ann[nodes.TERMINATE_AT] = sim.clock.iso(t0 + 120)
            ann[drainer.DRAIN_AT] = sim.clock.iso_micro(drain_at)

        warning = notices(sim, spot, NoticeKind.INTERRUPTION, "itn")
        for n in spot:
            store.mutate("nodes", n, None, mark)
        if order == "drainer-first":
            time.sleep(delay)
        handled_at = sim.clock.now() - t0
        handler.handle(warning)
        done_at = sim.clock.now() - t0
        wait(lambda: not any(p["spec"].get("nodeName") in spot for p in store.list("pods")[0]), 110)
        drained_at = sim.clock.now() - t0
        below = {k.split("/")[-1]: max(0, before[k] - tracker.lowest.get(k, 0)) for k in before}
        return {
            "order": order,
            "protection": protection,
            "drainer_at": round(drain_at - t0, 2),
            "spotguard_at": round(handled_at, 2),
            "spotguard_done": round(done_at, 2),
            "drained_at": round(drained_at, 1),
            "below": below,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--protections", default="none,guard,rebalance")
    args = parser.parse_args()
    protections = [p for p in args.protections.split(",") if p]
    logging.disable(logging.WARNING)
    runs = []
    for seed in range(args.seeds):
        delay = random.Random(seed).uniform(0.0, 2.0)
        for order in ("spotguard-first", "drainer-first"):
            for protection in protections:
                runs.append(run(order, protection, delay))
    held = {
        f"{o}/{p}": all(not any(r["below"].values()) for r in runs if r["order"] == o and r["protection"] == p)
        for o in ("spotguard-first", "drainer-first")
        for p in protections
    }
    print(json.dumps({"runs": runs, "promise_held": held, "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
