"""Duplicates, reordering and API faults, end to end on the simulated cluster.

Every spot node gets a state change (shutting-down) before its interruption
warning, each warning arrives ten times, and one in five API requests fails
with a 500. Notices that come back RETRY are delivered again, as SQS would.
In the end every workload was surged exactly once (by its pods on the doomed
nodes), no notice was lost, and once the nodes are gone every workload is back.
In the default surge (one copy of each Deployment, ``surge_copy``) and in the replica
surge (``surge_copy=False``: spec.replicas raised).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter

import pytest
from spotguard.gateway import stats as stats_mod
from spotguard.gateway.errors import ApiError
from spotguard.interruption import ledger
from spotguard.interruption.handler import Handler, Outcome
from spotguard.policy import config
from spotguard.policy.notices import NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard_sim import testing

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario
from tests.interruption.copy_watch import CopyWatch, copies_now
from tests.records import surge_record

TIME_SCALE = 20.0


def writes_by_resource(handler: Handler) -> Counter[str]:
    stats = handler.kube.stats
    return Counter({r: sum(stats.count(v, r) for v in stats_mod.WRITE_VERBS) for r in stats.by_resource})


@pytest.mark.parametrize("surge", ["copy", "replica"])
def test_duplicates_reordering_and_faults_surge_once(surge: str) -> None:
    copy_mode = surge == "copy"
    objs = sim_scenario.mixed_nodes() + sim_scenario.mixed_workloads()
    with testing.running_cluster(objs, time_scale=TIME_SCALE, ready_delay_seconds=30.0) as sim:
        store = sim.store
        before = h.floors_of(store)
        total = sum(r for r, _ in before.values())
        h.wait_until(lambda: h.ready_pods(store) == total, 30, "every pod Ready")
        spot = sorted(n["metadata"]["name"] for n in store.list("nodes")[0] if n["metadata"]["name"].startswith("spot"))
        doomed = Counter(
            h.workload_key(p)
            for p in store.list("pods")[0]
            if p["spec"].get("nodeName") in spot and (h.workload_key(p) or "").startswith("Deployment/")
        )

        # Every pod that ever ran on a doomed node (without the admission webhook here, a
        # surge replica may land on a spot node whose own notice comes later: it counts too).
        ever: dict[str, set[str]] = {}

        def on_change(event_type: str, resource: str, obj: dict) -> None:
            if (
                resource == "pods"
                and obj["spec"].get("nodeName") in spot
                and not obj["metadata"].get("deletionTimestamp")
            ):
                key = h.workload_key(obj)
                if key:
                    ever.setdefault(key, set()).add(obj["metadata"]["uid"])

        for p in store.list("pods")[0]:
            on_change("ADDED", "pods", p)
        store.subscribe(on_change)
        copies = CopyWatch(store)

        handler = h.handler_for(sim, config=dataclasses.replace(config.Config(), surge_copy=copy_mode))
        rnd = random.Random(7)
        # The state change for half of the nodes comes first, on its own; its first delivery
        # meets every surge write failing, so it certainly comes back RETRY (whatever
        # requests the random faults below happen to hit)...
        first = h.notices_for(sim, spot[::2], NoticeKind.STATE_CHANGE, state="shutting-down")
        verb, res = ("create", "replicasets") if copy_mode else ("patch", "deployments")
        sim.faults.set(verb=verb, resource=res, error_rate=1.0, status=500)
        assert Outcome.RETRY in handler.handle(first)
        sim.faults.clear()
        sim.faults.set(error_rate=0.2, status=500)
        h.deliver(handler, first)
        # ...then every warning ten times, with the other state changes, in any order.
        burst = h.notices_for(sim, spot) * 10 + h.notices_for(sim, spot[1::2], NoticeKind.STATE_CHANGE, "shutting-down")
        rnd.shuffle(burst)
        for i in range(0, len(burst), 10):  # SQS batches of ten
            h.deliver(handler, burst[i : i + 10])
        assert sim.faults.injected > 0

        # Exactly one surge per workload: by its pods on the doomed nodes, never twice.
        sim.faults.clear()
        assert copies.surged() == ({k for k, n in doomed.items() if n} if copy_mode else set())
        for d in store.list("deployments")[0]:
            key = f"Deployment/{d['metadata']['namespace']}/{d['metadata']['name']}"
            record = surge_record(store, d["metadata"]["name"])
            if not doomed[key]:
                assert record is None, key
                continue
            assert doomed[key] <= record["surge"] <= len(ever[key]), (key, record, len(ever[key]))
            if copy_mode:
                # One copy, never sized above the pods that ran on doomed nodes; the owner's
                # count untouched.
                assert d["spec"]["replicas"] == before[key][0], key
                assert copies.names[key] == {f"spotguard-surge-{d['metadata']['name']}"}, key
                assert copies.sizes[key] and max(copies.sizes[key]) <= len(ever[key]), (key, copies.sizes[key])
            else:
                assert d["spec"]["replicas"] == before[key][0] + record["surge"], key
            assert record["replicas"] == before[key][0]
            assert len(record["events"]) == len(set(record["events"]))
        # The Events tell the same story (best effort: under faults one may be missing, never one too many).
        added: Counter[str] = Counter()
        for e in store.list("events")[0]:
            if e.get("reason") == "SpotInterruptionSurge":
                added[e["involvedObject"]["name"]] += int(re.search(r"\(\+(\d+) on on-demand\)", e["message"]).group(1))
        for d in store.list("deployments")[0]:
            record = surge_record(store, d["metadata"]["name"]) or {"surge": 0}
            assert added[d["metadata"]["name"]] <= record["surge"]
        assert sum(added.values()) > 0
        for node in spot:
            taints = [
                t
                for t in store.get("nodes", node)["spec"].get("taints") or []
                if t["key"] == "spotguard.io/interruption"
            ]
            assert len(taints) == 1

        # A late replay of everything changes nothing. Only the surge ledger may be written:
        # it is written best effort after each handling, and one that failed under the faults
        # is made good by the next handling (this replay), once.
        written = writes_by_resource(handler)
        assert set(handler.handle(burst[:10])) == {Outcome.DONE}
        extra = writes_by_resource(handler) - written
        assert not {r: n for r, n in extra.items() if r != "configmaps"}, extra
        assert extra["configmaps"] <= 1, extra
        kept = ledger.read(handler.kube)
        for d in store.list("deployments")[0]:
            key = f"Deployment/{d['metadata']['namespace']}/{d['metadata']['name']}"
            found = surge_record(store, d["metadata"]["name"])
            on_workload = None if found is None else SurgeRecord.parse(json.dumps(found))
            assert kept.get(key) == on_workload, key

        # The nodes go; with faults again, the scheduled reconcile still brings everything back.
        sim.faults.set(error_rate=0.2, status=500)
        sim.reclaim(spot, after_seconds=120.0)

        def settled() -> bool:
            try:
                handler.reconcile()
            except ApiError:
                return False  # the schedule simply runs again
            if {n["metadata"]["name"] for n in store.list("nodes")[0]} & set(spot):
                return False
            deployments = store.list("deployments")[0]
            if any(surge_record(store, d["metadata"]["name"]) is not None for d in deployments):
                return False
            return all(h.floors_of(store)[k][0] == before[k][0] for k in before)

        h.wait_until(settled, 60, "every workload back", step=0.25)
        sim.faults.clear()
        assert copies_now(store) == {}
        assert not [b for b in store.list("poddisruptionbudgets")[0] if b["metadata"]["name"].startswith("spotguard-")]
        assert store.get("horizontalpodautoscalers", "api", "shop")["spec"]["minReplicas"] == 3
