"""Duplicates, reordering and API faults, end to end on the simulated cluster.

Every spot node gets a state change (shutting-down) before its interruption
warning, each warning arrives ten times, and one in five API requests fails
with a 500. Notices that come back RETRY are delivered again, as SQS would.
In the end every workload was surged exactly once (by its pods on the doomed
nodes), no notice was lost, and once the nodes are gone every workload is back.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter

from spotguard.gateway.errors import ApiError
from spotguard.interruption.handler import Outcome
from spotguard.policy.notices import NoticeKind
from spotguard.policy.workloads import SURGE
from spotguard.sim import testing

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario

TIME_SCALE = 20.0


def test_duplicates_reordering_and_faults_surge_once() -> None:
    objs = sim_scenario.mixed_nodes() + sim_scenario.mixed_workloads()
    with testing.running_cluster(objs, time_scale=TIME_SCALE, ready_delay_seconds=30.0) as sim:
        store = sim.store
        before = h.floors_of(store)
        total = sum(r for r, _ in before.values())
        h.wait_until(lambda: sum(1 for p in store.list("pods")[0] if h.is_ready(p)) == total, 30, "every pod Ready")
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

        handler = h.handler_for(sim)
        sim.faults.set(error_rate=0.2, status=500)
        rnd = random.Random(7)
        # The state change for half of the nodes comes first, on its own...
        first = h.notices_for(sim, spot[::2], NoticeKind.STATE_CHANGE, state="shutting-down")
        rounds = [h.deliver(handler, first)]
        # ...then every warning ten times, with the other state changes, in any order.
        burst = h.notices_for(sim, spot) * 10 + h.notices_for(sim, spot[1::2], NoticeKind.STATE_CHANGE, "shutting-down")
        rnd.shuffle(burst)
        for i in range(0, len(burst), 10):  # SQS batches of ten
            rounds.append(h.deliver(handler, burst[i : i + 10]))
        assert sim.faults.injected > 0
        assert max(rounds) > 1  # some notices did come back RETRY, and were delivered again

        # Exactly one surge per workload: by its pods on the doomed nodes, never twice.
        sim.faults.clear()
        for d in store.list("deployments")[0]:
            key = f"Deployment/{d['metadata']['namespace']}/{d['metadata']['name']}"
            record = json.loads((d["metadata"].get("annotations") or {}).get(SURGE) or "null")
            if not doomed[key]:
                assert record is None, key
                continue
            assert doomed[key] <= record["surge"] <= len(ever[key]), (key, record, len(ever[key]))
            assert d["spec"]["replicas"] == before[key][0] + record["surge"], key
            assert record["replicas"] == before[key][0]
            assert len(record["events"]) == len(set(record["events"]))
        # The Events tell the same story (best effort: under faults one may be missing, never one too many).
        added: Counter[str] = Counter()
        for e in store.list("events")[0]:
            if e.get("reason") == "SpotInterruptionSurge":
                added[e["involvedObject"]["name"]] += int(re.search(r"\(\+(\d+) on on-demand\)", e["message"]).group(1))
        for d in store.list("deployments")[0]:
            record = json.loads((d["metadata"].get("annotations") or {}).get(SURGE) or '{"surge": 0}')
            assert added[d["metadata"]["name"]] <= record["surge"]
        assert sum(added.values()) > 0
        for node in spot:
            taints = [
                t
                for t in store.get("nodes", node)["spec"].get("taints") or []
                if t["key"] == "spotguard.io/interruption"
            ]
            assert len(taints) == 1

        # A late replay of everything changes nothing.
        writes = handler.kube.stats.writes
        assert set(handler.handle(burst[:10])) == {Outcome.DONE}
        assert handler.kube.stats.writes == writes

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
            if any(SURGE in (d["metadata"].get("annotations") or {}) for d in deployments):
                return False
            return all(h.floors_of(store)[k][0] == before[k][0] for k in before)

        h.wait_until(settled, 60, "every workload back", step=0.25)
        sim.faults.clear()
        assert not [b for b in store.list("poddisruptionbudgets")[0] if b["metadata"]["name"].startswith("spotguard-")]
        assert store.get("horizontalpodautoscalers", "api", "shop")["spec"]["minReplicas"] == 3
