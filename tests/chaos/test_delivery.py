"""Chaos in the delivery: the function process killed half-way, SQS's duplicates, disorder
and messages that are not ours; each with the promise checked end to end (``harness``)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spotguard.policy.notices import NoticeKind
from spotguard.policy.workloads import SURGE, SURGE_OF
from spotguard_sim import readiness

from tests.chaos import harness as h
from tests.chaos.test_chaos import FAULTS, full, time_scale_for
from tests.interruption.transport_support import Moto


def on_nodes(c: h.Chaos, names: list[str]) -> dict[str, str]:
    """Deployment pods ever bound to ``names`` (uid -> workload), kept up to date by a watch:
    those there now and those bound there later (a surge pod can land on a spot node whose
    notice has not come yet; that node's own notice then rightly surges again)."""
    seen: dict[str, str] = {}

    def add(pod: dict[str, Any]) -> None:
        key = readiness.workload_key(pod) or ""
        if pod["spec"].get("nodeName") in names and key.startswith("Deployment/"):
            seen[pod["metadata"]["uid"]] = key

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods":
            add(obj)

    c.sim.store.subscribe(watch)
    for p in c.sim.store.list("pods")[0]:
        add(p)
    return seen


def highest_replicas(c: h.Chaos) -> dict[str, int]:
    """The highest count each Deployment reaches from now on, its surge included: its
    spec.replicas plus its surge copy's (``surge_copy``, the default: the copy, a ReplicaSet
    labelled ``SURGE_OF``, carries the surge and spec.replicas stays the owner's). Updated by
    a watch."""
    highest: dict[str, int] = {}
    counts: dict[str, int] = {}
    copies: dict[str, int] = {}

    def seen(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if resource == "deployments":
            key = f"Deployment/{meta['namespace']}/{meta['name']}"
            counts[key] = int(obj["spec"].get("replicas", 1))
        elif resource == "replicasets" and SURGE_OF in (meta.get("labels") or {}):
            key = f"Deployment/{meta['namespace']}/{meta['labels'][SURGE_OF]}"
            copies[key] = 0 if event_type == "DELETED" else int(obj["spec"].get("replicas", 1))
        else:
            return
        highest[key] = max(highest.get(key, 0), counts.get(key, 0) + copies.get(key, 0))

    c.sim.store.subscribe(seen)
    for d in c.sim.store.list("deployments")[0]:
        seen("ADDED", "deployments", d)
    return highest


def assert_surged_once(c: h.Chaos, doomed: dict[str, str], highest: dict[str, int]) -> None:
    """At most one surge replica for each pod ever on a doomed node."""
    for key, n in Counter(doomed.values()).items():
        assert highest.get(key, 0) <= c.owner[key] + n, f"{key} surged more than once: {highest.get(key)}"


def fault_cases(quick: str) -> list[Any]:
    out = []
    for f in FAULTS:
        marks: list[Any] = [] if f == quick else [full]
        out.append(pytest.param(f, id=f, marks=marks))
    return out


@pytest.mark.parametrize("fault", fault_cases("no-faults"))
def test_process_killed_mid_handling_then_redelivered(fault: str, tmp_path: Path, aws_env: Moto) -> None:
    with h.chaos(tmp_path, aws_env.url, interruption_in_process=False, time_scale=time_scale_for(fault)) as c:
        FAULTS[fault](c)
        spot = c.spot()
        doomed = on_nodes(c, spot)
        highest = highest_replicas(c)
        # Every surge write takes a second (the copy's create with its record; the replica
        # surge's patch of the Deployment): the process dies with its surges in flight.
        c.sim.faults.set(verb="create", resource="replicasets", latency_seconds=1.0)
        c.sim.faults.set(verb="patch", resource="deployments", latency_seconds=1.0)
        c.interrupt(spot)
        h.wait_until(lambda: bool(c.taints_seen), c.window(30), "the handling to start (the first taint)")
        c.kill_child()
        surged = {k for k, w in c.workload_views().items() if SURGE in w.annotations}
        assert surged < set(doomed), "every surge was written before the kill"
        assert c.queue.depth() > 0, "the notices were deleted before they were handled"
        c.sim.faults.clear()
        FAULTS[fault](c)
        c.start_child()  # a new process; the messages come back after their visibility timeout
        c.settle()
        c.check_promise()
        assert_surged_once(c, doomed, highest)


@pytest.mark.parametrize("fault", fault_cases("faults-20pct-500"))
def test_duplicated_reordered_and_foreign_messages(fault: str, tmp_path: Path, aws_env: Moto) -> None:
    with h.chaos(tmp_path, aws_env.url, time_scale=time_scale_for(fault)) as c:
        FAULTS[fault](c)
        rnd = random.Random(11)
        spot = c.spot()
        doomed = on_nodes(c, spot)
        highest = highest_replicas(c)
        c.arm()
        now = c.sim.clock.now()
        warnings = c.bodies(spot)
        bodies = warnings * 3  # at-least-once: the same message body again
        bodies += c.bodies(spot, NoticeKind.REBALANCE)  # the recommendation, after its warning
        bodies += [
            h.eventbridge(NoticeKind.INTERRUPTION, f"i-0fffffffffffff{i:03d}", f"foreign-{i}", now) for i in range(6)
        ]  # another cluster's instances
        bodies += [
            h.eventbridge(NoticeKind.STATE_CHANGE, f"i-0eeeeeeeeeeeee{i:03d}", f"running-{i}", now, "running")
            for i in range(3)
        ]
        bodies += ["Hello from SQS!", '{"detail-type": "EC2 Spot Instance Interruption Warning"}', "{}"]
        rnd.shuffle(bodies)
        c.doomed.update(spot)
        c.sim.reclaim(spot, after_seconds=h.RECLAIM_AFTER)
        c.queue.send(bodies)
        c.settle()
        c.check_promise()
        assert_surged_once(c, doomed, highest)
