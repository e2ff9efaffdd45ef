"""The eviction guard and a Deployment's surge copy end to end: the served admission function
(HTTPS, the shipped ValidatingWebhookConfiguration, default settings), real ``pods/eviction``
calls with the official client, the simulated cluster (RBAC as shipped is checked by
tests/security/test_rbac.py).

- a drainer evicts a pod of the copy (a ReplicaSet of spotguard's with no controller): it is
  one of the Deployment's replicas, held as the Deployment's own are;
- the Deployment replaced (``kubectl replace``: its ``spotguard.io/surge`` record gone) while
  its copy carries the record: the guard reads the copy's, and holds a doomed pod per its
  cover.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from spotguard.policy import config, surgecopy
from spotguard.policy.notices import NODE_NOTICE, NodeNotice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE, SURGE_OF
from spotguard_sim import testing

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario
from tests.interruption.test_e2e_eviction_guard_drains import DEFAULT, cordon, evict, exists, pinned, wait_sim
from tests.interruption.test_e2e_owners import READY_DELAY, TIME_SCALE


@pytest.fixture
def web() -> Iterator[Any]:
    """od-0 and spot-0; web, one replica, serving on spot-0."""
    objs = [*sim_scenario.mixed_nodes(on_demand=1, spot=1), pinned("web", 1, "spot-0")]
    with testing.running_cluster(objs, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim:
        h.wait_until(lambda: h.ready_pods(sim.store) == 1, 30, "web serving")
        yield sim


def record_for(sim: Any, node: str, until: float) -> SurgeRecord:
    """web's surge by a copy for ``node`` (reclaimed at ``until``): web served 1 before it."""
    now = sim.clock.now()
    return SurgeRecord(replicas=1, surge=1, events=("itn-1",), nodes=(node,), started=now, ready=1,
                       written=1, until=((node, until),), copy=True)


def make_copy(sim: Any, *, on_demand: bool, record: SurgeRecord | None = None) -> None:
    """web's surge copy as spotguard makes it (``surgecopy.build``, one replica), created
    through the API. web's template pins its pods to spot-0: a copy of spot slots
    (``on_demand=False``, a drain-only surge's) runs there too; one pinned to on-demand stays
    Pending (a replacement still starting)."""
    body = surgecopy.build(sim.store.get("deployments", "web", "shop"), 1, config.Config(), on_demand=on_demand,
                           record=record)
    assert not isinstance(body, surgecopy.Refusal), body
    client.AppsV1Api(sim.api_client()).create_namespaced_replica_set("shop", body)
    h.wait_until(lambda: copy_pod(sim) is not None, 30, "the copy's pod")


def copy_pod(sim: Any) -> dict[str, Any] | None:
    for p in sim.store.list("pods", namespace="shop")[0]:
        if p["metadata"]["labels"].get(SURGE_OF) == "web" and not p["metadata"].get("deletionTimestamp"):
            return p
    return None


def own_pod(sim: Any) -> str:
    [name] = [p["metadata"]["name"] for p in sim.store.list("pods", namespace="shop")[0]
              if SURGE_OF not in p["metadata"]["labels"] and h.is_ready(p)]
    return str(name)


def mark(sim: Any, node: str, notice: NodeNotice) -> None:
    """spotguard's notice on ``node``, as the handler writes it (mark, taint, cordon)."""

    def write(n: dict[str, Any]) -> None:
        n["metadata"].setdefault("annotations", {})[NODE_NOTICE] = notice.to_json()
        n["spec"]["unschedulable"] = True
        n["spec"].setdefault("taints", []).append({"key": INTERRUPTION_TAINT, "value": notice.event_id,
                                                   "effect": "NoSchedule"})

    sim.store.mutate("nodes", node, None, write)


def test_a_drainer_evicting_a_pod_of_the_copy_waits_for_the_deployments_replacements(web: Any, tmp_path: Any) -> None:
    """GIVEN web's surge copy of spot slots (a drain-only surge's), its pod serving on spot-0
    beside web's own, WHEN spot-0 gets spotguard's interruption notice and a drainer evicts
    the copy's pod, THEN it is held as web's own pod is (the copy's ReplicaSet has no
    controller: the guard answered "not-managed" and let it go, web with nothing Ready on a
    node that stays), until the reclaim's release."""
    sim = web
    now = sim.clock.now()
    sim.store.mutate("deployments", "web", "shop", lambda d: d["metadata"].setdefault("annotations", {}).__setitem__(
        SURGE, record_for(sim, "spot-0", now + 120).to_json()))
    make_copy(sim, on_demand=False)
    h.wait_until(lambda: h.ready_pods(sim.store) == 2, 30, "the copy's pod serving")
    pod = copy_pod(sim)
    assert pod is not None and pod["spec"]["nodeName"] == "spot-0", pod
    name = pod["metadata"]["name"]
    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timeout_seconds=None):
        notice = NodeNotice("itn-1", NoticeKind.INTERRUPTION, now, now + 120)
        mark(sim, "spot-0", notice)
        refused = evict(sim, name)
        assert refused is not None and refused.status == 429, refused
        message = json.loads(refused.body)["message"]
        assert "spotguard: Deployment shop/web has 0 Ready pods on nodes that stay" in message, message
        assert "node spot-0 is reclaimed at" in message, message
        assert exists(sim, name)
        own = evict(sim, own_pod(sim))
        assert own is not None and own.status == 429, own
        # never wedged: the drain goes 30 s before the reclaim time
        wait_sim(sim, notice.until - DEFAULT.release - sim.clock.now(), "the reclaim's release")
        assert evict(sim, name) is None
        assert not exists(sim, name)


def test_a_replaced_deployments_doomed_pod_is_held_per_the_record_its_copy_carries(web: Any, tmp_path: Any) -> None:
    """GIVEN web's surge for spot-0 (its record on web and on its copy, whose pod is still
    starting), WHEN ``kubectl replace`` puts web back as in git (no ``spotguard.io/surge``) and
    a drainer cordons spot-0, whose notice spotguard could not write, THEN web's pod there is
    held past the grace for a node without a notice, per the copy's record (it covers spot-0
    to its reclaim time; the guard read web's annotation only and let the pod go), and goes
    at the reclaim's release."""
    sim = web
    now = sim.clock.now()
    until = now + 100
    record = record_for(sim, "spot-0", until)
    sim.store.mutate("deployments", "web", "shop", lambda d: d["metadata"].setdefault("annotations", {}).__setitem__(
        SURGE, record.to_json()))
    make_copy(sim, on_demand=True, record=record)  # pinned to on-demand, web's template to spot-0: Pending
    apps = client.AppsV1Api(sim.api_client())
    live = apps.read_namespaced_deployment("web", "shop")
    live.metadata.annotations = {}
    apps.replace_namespaced_deployment("web", "shop", live)  # kubectl replace -f web.yaml
    assert SURGE not in (sim.store.get("deployments", "web", "shop")["metadata"].get("annotations") or {})
    pod = own_pod(sim)
    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timeout_seconds=None):
        cordon(sim, "spot-0")
        first = evict(sim, pod)
        assert first is not None and first.status == 429, first
        wait_sim(sim, DEFAULT.grace + 2, "past the grace for a node without a notice")
        held = evict(sim, pod)
        assert held is not None and held.status == 429, held
        message = json.loads(held.body)["message"]
        assert "the workload's surge covers it" in message and "keeps 1" in message, message
        assert exists(sim, pod)
        wait_sim(sim, until - DEFAULT.release - sim.clock.now(), "the reclaim's release")
        assert evict(sim, pod) is None
        assert not exists(sim, pod)
