"""The handler against the simulated cluster's API (real HTTPS, the official client).

The controllers are off: these tests set the pods' state themselves, so every
step (surge, scale back) is decided by the handler alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from spotguard.gateway import kube, retry
from spotguard.gateway import resources as r
from spotguard.interruption import dispatch
from spotguard.interruption import handler as handler_mod
from spotguard.interruption.handler import Handler, Outcome
from spotguard.nodeadded import reconciler
from spotguard.policy import config, interruption, moves, patches, surgecopy, surges
from spotguard.policy import views as pod_views
from spotguard.policy.notices import Notice, NoticeKind
from spotguard.policy.workloads import DELETION_COST, SURGE, SURGE_OF, surge_copy_name
from spotguard_sim import pods as pod_util
from spotguard_sim import testing

from tests.interruption import sim_scenario as sc
from tests.records import surge_record

Obj = dict[str, Any]


def pod(owner: Obj, index: int, node: str, ready: bool = True) -> Obj:
    name = owner["metadata"]["name"]
    ns = owner["metadata"]["namespace"]
    if owner["kind"] == "Deployment":
        ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-5d4f8", "uid": "rs", "controller": True}
        labels = {"app": name, "pod-template-hash": "5d4f8"}
        pod_name = f"{name}-5d4f8-{index:05d}"
    else:
        ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": "sts", "controller": True}
        labels = {"app": name}
        pod_name = f"{name}-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "ownerReferences": [ref]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Cluster:
    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.store = sim.store
        self.kube = kube.Kube(sim.api_client())
        self.now = sim.clock.now

    def handler(self, **kw: Any) -> Handler:
        return Handler(self.kube, kw.pop("config", config.Config()), clock=kw.pop("clock", self.now), **kw)

    def notice(self, node: str, kind: NoticeKind = NoticeKind.INTERRUPTION, state: str = "", event: str = "") -> Notice:
        return Notice(
            event_id=event or f"{kind}-{node}",
            kind=kind,
            instance_id=sc.instance_id(node),
            time=datetime.fromtimestamp(self.now(), UTC),
            state=state,
        )

    def deployment(self, name: str) -> Obj:
        return self.store.get("deployments", name, "shop")

    def record(self, name: str) -> Obj | None:
        return surge_record(self.store, name)

    def taints(self, node: str) -> list[Obj]:
        return [
            t for t in self.store.get("nodes", node)["spec"].get("taints") or [] if t["key"].startswith("spotguard")
        ]

    def set_ready(self, pod_name: str, ready: bool) -> None:
        def edit(p: Obj) -> None:
            p["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

        self.store.mutate("pods", pod_name, "shop", edit)


# Both surge modes: the copy (the default: a spotguard-owned ReplicaSet) and the replica
# surge (surge_copy=False: the Deployment's spec.replicas raised).
MODES = pytest.mark.parametrize("copy", [True, False], ids=["copy", "replica"])


def mode(copy: bool, **settings: Any) -> config.Config:
    return dataclasses.replace(config.Config(**settings), surge_copy=copy)


def replica_mode(**settings: Any) -> config.Config:
    return mode(False, **settings)


def record_write(copy: bool) -> tuple[str, str]:
    """The request that writes a surge's record once its copy exists: the copy's merge patch
    (guarded by its resourceVersion), or the Deployment's patch (the replica surge)."""
    return ("patch", "replicasets") if copy else ("patch", "deployments")


def pinned_on_demand(rs: Obj) -> bool:
    """Every required node term of the copy's pods asks for on-demand (as admission does)."""
    terms = rs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    wanted = patches.on_demand_expressions(config.Config())
    return bool(terms) and all(e in t.get("matchExpressions", []) for t in terms for e in wanted)


def assert_surged(c: Cluster, name: str, replicas: int, surge: int, copy: bool) -> None:
    """``name`` (at ``replicas``) surged by ``surge``: in copy mode its copy holds the surge, pinned
    to on-demand, and its spec.replicas is untouched; in replica mode spec.replicas holds it."""
    rs = surge_copy(c, name)
    if copy:
        assert c.deployment(name)["spec"]["replicas"] == replicas
        if surge == 0:
            # No copy, or one at 0 keeping its record (a surge in progress that needs no pod,
            # or a finished one while a doomed node exists).
            assert rs is None or rs["spec"]["replicas"] == 0, rs
            return
        assert rs is not None, f"no surge copy of {name}"
        assert rs["spec"]["replicas"] == surge
        assert pinned_on_demand(rs), rs["spec"]["template"]["spec"]
        assert c.record(name)["copy"] is True
    else:
        assert rs is None, rs
        assert c.deployment(name)["spec"]["replicas"] == replicas + surge


def replacements_ready_doomed_pods_not(c: Cluster) -> None:
    """web's and single's own replacements Ready on od-0; their pods on spot-0 not Ready."""
    new = [pod(c.deployment("web"), i, "od-0") for i in range(10, 13)]
    new += [pod(c.deployment("single"), 10, "od-0")]
    c.store.apply_objects(new)
    c.set_ready("web-5d4f8-00001", False)
    c.set_ready("single-5d4f8-00000", False)


def spot_0_goes(c: Cluster, h: Handler) -> None:
    """spot-0 and its pods leave the API; its state change (terminated) is handled, ignored."""
    c.store.remove("nodes", "spot-0")
    for p in ("web-5d4f8-00001", "single-5d4f8-00000", "db-1"):
        c.store.remove("pods", p, "shop")
    assert h.handle([c.notice("spot-0", NoticeKind.STATE_CHANGE, state="terminated")]) == [Outcome.IGNORED]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    web = sc.deployment("web", 3)
    single = sc.deployment("single", 1, **{"spotguard.io/min-on-demand": "0"})
    db = sc.statefulset("db", 3)
    objs = [sc.namespace("shop"), sc.namespace("spotguard")]
    objs += [sc.node("od-0", "on-demand"), sc.node("spot-0", "spot"), sc.node("spot-1", "spot")]
    objs += [web, single, db, sc.hpa("single", "single", 1, 1)]
    objs += [pod(web, 0, "od-0"), pod(web, 1, "spot-0"), pod(web, 2, "spot-1"), pod(single, 0, "spot-0")]
    objs += [pod(db, 0, "od-0"), pod(db, 1, "spot-0"), pod(db, 2, "spot-1")]
    with testing.running_cluster(objs, controllers=False) as sim:
        yield Cluster(sim)


@MODES
def test_a_batch_is_one_plan_with_outcomes_in_order(cluster: Cluster, copy: bool) -> None:
    c = cluster
    h = c.handler(config=mode(copy))
    notices = [
        c.notice("spot-0"),
        Notice("ev-x", NoticeKind.INTERRUPTION, "i-0123456789abcdef0", datetime.now(UTC)),  # another cluster's
        c.notice("spot-0", NoticeKind.STATE_CHANGE, state="running"),
        c.notice("spot-0"),  # a duplicate in the same batch
    ]
    assert h.handle(notices) == [Outcome.DONE, Outcome.IGNORED, Outcome.IGNORED, Outcome.DONE]
    assert c.taints("spot-0") == [
        {"key": "spotguard.io/interruption", "value": "interruption-spot-0", "effect": "NoSchedule"}
    ]
    assert c.taints("spot-1") == []
    assert_surged(c, "web", 3, 1, copy)
    assert_surged(c, "single", 1, 1, copy)
    web = c.record("web")
    assert (web["replicas"], web["surge"], web["nodes"], web["events"]) == (3, 1, ["spot-0"], ["interruption-spot-0"])
    # The temporary budget holds the Ready count.
    pdb = c.store.get("poddisruptionbudgets", "spotguard-surge-web", "shop")
    assert pdb["spec"] == {"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}}
    assert pdb["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "spotguard"}
    assert pdb["metadata"]["ownerReferences"][0]["name"] == "web"
    hpa = c.store.get("horizontalpodautoscalers", "single", "shop")["spec"]
    if copy:
        # The autoscaler's writes do not touch the copy: its limits stay as they are.
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 1)
        assert not c.record("single").get("hpa")
    else:
        # replica surge (surge_copy=False): the autoscaler's limits are raised to keep the surge.
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 2)
        assert c.record("single")["hpa"] == {
            "name": "single",
            "minReplicas": 1,
            "maxReplicas": 1,
            "setMin": 2,
            "setMax": 2,
        }
    # Writes: one taint; a copy each carrying its record (the Deployments untouched), or a patch
    # each and the autoscaler; a budget each; Events.
    assert c.kube.stats.count("patch", "nodes") == 1
    assert c.kube.stats.count("patch", "deployments.apps") == (0 if copy else 2)
    assert c.kube.stats.count("create", "replicasets.apps") == (2 if copy else 0)
    assert c.kube.stats.count("patch", "horizontalpodautoscalers.autoscaling") == (0 if copy else 1)
    # nodes, pods, budgets, autoscalers, namespaces, ledger, 2 workloads (and the copies)
    assert c.kube.stats.count("list") == (9 if copy else 8)
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in c.store.list("events")[0]}
    assert {("Node", "SpotInterruption"), ("Deployment", "SpotInterruptionSurge")} <= reasons

    # Replayed: nothing is written again.
    writes = c.kube.stats.writes
    assert h.handle(notices[:1] * 10) == [Outcome.DONE] * 10
    assert c.kube.stats.writes == writes


def test_the_collector_stays_paused_through_the_writes(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole handling, its writes and Events included, runs inside one pause of the
    collector (the gateway's, counted across threads): re-enabled after the plan, its
    first passes walked the snapshot again in the middle of the surges."""
    c = cluster
    depth = [0]
    seen: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def paused() -> Iterator[None]:
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    monkeypatch.setattr(handler_mod, "_gc_paused", paused)
    for name in ("patch", "create", "create_event"):
        real = getattr(c.kube, name)

        def spy(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append((_name, depth[0]))
            return _real(*a, **kw)

        monkeypatch.setattr(c.kube, name, spy)
    assert c.handler().handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert {n for n, _ in seen} >= {"patch", "create", "create_event"}, seen
    assert all(d > 0 for _, d in seen), seen
    assert depth[0] == 0


def test_quorum_warning_for_a_statefulset(cluster: Cluster) -> None:
    c = cluster
    assert c.handler().handle([c.notice("spot-0"), c.notice("spot-1")]) == [Outcome.DONE] * 2
    warnings = [e for e in c.store.list("events")[0] if e["reason"] == "QuorumAtRisk"]
    assert [w["involvedObject"]["name"] for w in warnings] == ["db"]
    assert "below the quorum floor of 2" in warnings[0]["message"]
    assert c.store.get("statefulsets", "db", "shop")["spec"]["replicas"] == 3  # no surge


def test_a_user_budget_gets_no_second_budget(cluster: Cluster) -> None:
    c = cluster
    c.store.apply_objects([sc.pdb("web-pdb", "web", min_available=2)])
    c.handler().handle([c.notice("spot-0")])
    names = {b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets")[0]}
    assert names == {"web-pdb", "spotguard-surge-single"}
    assert "budget" not in c.record("web")


def test_scale_back_keeps_the_users_change_and_restores_everything(cluster: Cluster) -> None:
    # replica surge (surge_copy=False): the scale back keeps a count the user wrote during the
    # surge and puts the autoscaler's limits back (the copy's end: the test after this one).
    c = cluster
    h = c.handler(config=replica_mode())
    h.handle([c.notice("spot-0")])
    # While it runs, the user scales web from 3 to 5 (4 + 1 surge -> 6).
    c.kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 6}}, "shop")
    h.reconcile()
    assert c.record("web") is not None  # the doomed pods are still Ready
    # The replacements come up on on-demand; the doomed pods go not Ready (the node is going).
    replacements_ready_doomed_pods_not(c)
    h.reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 5
    assert c.deployment("single")["spec"]["replicas"] == 1
    # spot-0 still exists: a finished record stays (surge 0), so a replay changes nothing.
    web = c.record("web")
    assert web["done"] is True and web["surge"] == 0
    hpa = c.store.get("horizontalpodautoscalers", "single", "shop")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 1)
    # the end marked the autoscaler it put back (a retried handling of this surge leaves it alone)
    marks = c.store.get("horizontalpodautoscalers", "single", "shop")["metadata"]["annotations"]
    assert marks.get(interruption.HPA_RESTORED) == f"{float(c.record('single')['started']):.3f}", marks
    assert interruption.HPA_SET_MIN not in marks
    assert [b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets")[0]] == []
    writes = c.kube.stats.writes
    h.handle([c.notice("spot-0")])
    assert c.kube.stats.writes == writes
    assert c.deployment("web")["spec"]["replicas"] == 5
    # The node goes (a state change says so): the record is removed.
    spot_0_goes(c, h)
    assert c.record("web") is None and c.record("single") is None
    assert c.deployment("web")["spec"]["replicas"] == 5


def test_a_copy_surge_ends_keeping_the_users_change_and_leaving_nothing(cluster: Cluster) -> None:
    """The copy's end (the default mode): the user's count written during the surge stays,
    the copies and budgets go, the autoscaler was never touched, a replay changes nothing."""
    c = cluster
    h = c.handler()
    h.handle([c.notice("spot-0")])
    assert_surged(c, "web", 3, 1, copy=True)
    assert_surged(c, "single", 1, 1, copy=True)
    # While it runs, the user scales web from 3 to 5: the copy still holds what the doomed pod serves.
    c.kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, "shop")
    h.reconcile()
    assert c.record("web") is not None  # the doomed pods are still Ready
    assert_surged(c, "web", 5, 1, copy=True)
    # The Deployments' own replacements come up on on-demand; the doomed pods go not Ready.
    replacements_ready_doomed_pods_not(c)
    h.reconcile()
    # spot-0 still exists: each copy stays at 0, its pods gone, keeping the finished record
    # (surge 0), so a replay changes nothing. The Deployments were never written.
    assert surge_copy(c, "web")["spec"]["replicas"] == 0 and surge_copy(c, "single")["spec"]["replicas"] == 0
    assert c.deployment("web")["spec"]["replicas"] == 5
    assert c.deployment("single")["spec"]["replicas"] == 1
    assert SURGE not in (c.deployment("web")["metadata"].get("annotations") or {})
    assert c.kube.stats.count("patch", "deployments.apps") == 1  # the user's scale, no write of spotguard's
    web = c.record("web")
    assert web["done"] is True and web["surge"] == 0
    hpa = c.store.get("horizontalpodautoscalers", "single", "shop")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 1)
    assert c.kube.stats.count("patch", "horizontalpodautoscalers.autoscaling") == 0
    assert [b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets")[0]] == []
    writes = c.kube.stats.writes
    h.handle([c.notice("spot-0")])
    assert c.kube.stats.writes == writes
    assert surge_copy(c, "web")["spec"]["replicas"] == 0 and c.deployment("web")["spec"]["replicas"] == 5
    # The node goes (a state change says so): the copies go, and their records with them.
    spot_0_goes(c, h)
    assert c.record("web") is None and c.record("single") is None
    assert c.deployment("web")["spec"]["replicas"] == 5
    assert c.store.list("replicasets", namespace="shop")[0] == []


@MODES
def test_a_ledger_entry_left_by_a_failed_ledger_write_goes_quietly(cluster: Cluster, copy: bool) -> None:
    # Seen in the chaos suite under timeouts: a scale back went through, its ledger write timed
    # out, and the next pass took the entry for a lost record: a second "scaled back" Event
    # saying the workload was replaced, and a Deployment write for nothing.
    from spotguard.interruption import ledger

    c = cluster
    h = c.handler(config=mode(copy))
    h.handle([c.notice("spot-0")])
    assert "Deployment/shop/web" in ledger.read(c.kube)
    # The surge is over and ended (record removed, budgets gone); the ledger keeps the entry.
    for name, replicas in (("web", 3), ("single", 1)):
        c.kube.patch(
            r.DEPLOYMENTS, name, {"metadata": {"annotations": {SURGE: None}}, "spec": {"replicas": replicas}}, "shop"
        )
    for b in c.store.list("poddisruptionbudgets")[0]:
        c.store.remove("poddisruptionbudgets", b["metadata"]["name"], "shop")
    if copy:
        # The copies went with the end; the Deployments' own replacements serve.
        for name in ("web", "single"):
            c.store.remove("replicasets", surge_copy_name(name), "shop")
        c.store.apply_objects([pod(c.deployment("web"), 10, "od-0"), pod(c.deployment("single"), 10, "od-0")])
    else:
        # replica surge (surge_copy=False): the scale back put the autoscaler's limits back too.
        c.kube.patch(r.HPAS, "single", {"spec": {"minReplicas": 1, "maxReplicas": 1}}, "shop")
    c.store.remove("nodes", "spot-0")
    for p in ("web-5d4f8-00001", "single-5d4f8-00000", "db-1"):
        c.store.remove("pods", p, "shop")
    patches = c.kube.stats.count("patch", "deployments")
    h.reconcile()
    assert c.kube.stats.count("patch", "deployments") == patches
    assert ledger.read(c.kube) == {}
    told = [e["involvedObject"]["name"] for e in c.store.list("events", namespace="shop")[0]]
    assert told.count("web") == 1  # the surge's; no scale back told
    assert c.deployment("web")["spec"]["replicas"] == 3
    assert surge_copy(c, "web") is None and c.kube.stats.count("create", "replicasets.apps") == (2 if copy else 0)


def test_a_workload_opted_out_before_its_surge_is_written_gets_no_ledger_entry(cluster: Cluster) -> None:
    # The surge patch meets a conflict: the owner opted the workload out meanwhile. The re-plan
    # wants no surge; the planned record, never written, must not reach the ledger either (a
    # ledger entry with no record on the workload reads as a lost record, "replaced").
    from spotguard.interruption import ledger
    from spotguard.policy.workloads import ENABLED

    c = cluster
    store = c.store

    class OptOutBeforeThePatch(kube.Kube):
        armed = True

        def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> Any:
            if self.armed and res is r.DEPLOYMENTS and name == "web":
                self.armed = False
                store.mutate(
                    "deployments",
                    "web",
                    "shop",
                    lambda d: d["metadata"].setdefault("annotations", {}).update({ENABLED: "false"}),
                )
            return super().patch(res, name, body, namespace, **kw)

    connection = OptOutBeforeThePatch(c.sim.api_client())
    # The replica surge's patch of the Deployment (a copy's surge does not write the Deployment:
    # its conflicts are the copy's, test_a_conflict_is_replanned).
    h = Handler(connection, config.Config(surge_copy=False), clock=c.now)
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert not connection.armed
    assert c.record("web") is None and c.deployment("web")["spec"]["replicas"] == 3
    assert "Deployment/shop/web" not in ledger.read(c.kube)
    assert "Deployment/shop/single" in ledger.read(c.kube)


@MODES
def test_state_change_before_the_warning(cluster: Cluster, copy: bool) -> None:
    c = cluster
    h = c.handler(config=mode(copy))
    assert h.handle([c.notice("spot-1", NoticeKind.STATE_CHANGE, state="shutting-down")]) == [Outcome.DONE]
    assert c.record("web")["surge"] == 1
    assert h.handle([c.notice("spot-1")]) == [Outcome.DONE]
    assert c.record("web")["surge"] == 1
    assert_surged(c, "web", 3, 1, copy)


@MODES
@pytest.mark.parametrize(
    ("action", "taints", "surge", "outcome"),
    [("ignore", 0, 0, Outcome.IGNORED), ("taint", 1, 0, Outcome.DONE), ("surge", 1, 1, Outcome.DONE)],
)
def test_rebalance_recommendation(
    cluster: Cluster, action: str, taints: int, surge: int, outcome: Outcome, *, copy: bool
) -> None:
    c = cluster
    cfg = mode(copy, rebalance_action=config.RebalanceAction(action))
    assert c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)]) == [outcome]
    assert len(c.taints("spot-0")) == taints
    assert_surged(c, "web", 3, surge, copy)
    reasons = {e["reason"] for e in c.store.list("events")[0]}
    assert ("RebalanceRecommendation" in reasons) == bool(taints)
    # Never a drain: every pod is still there.
    assert len(c.store.list("pods")[0]) == 7


@MODES
def test_transient_failures_retry_only_what_failed(cluster: Cluster, copy: bool) -> None:
    c = cluster
    h = c.handler(config=mode(copy))
    # The surge's write: the copy with its record (one create), or the Deployment's patch.
    verb, res = ("create", "replicasets") if copy else ("patch", "deployments")
    c.sim.faults.set(verb=verb, resource=res, error_rate=1.0, status=500)
    out = h.handle([c.notice("spot-0"), c.notice("spot-1", NoticeKind.REBALANCE)])
    assert out == [Outcome.RETRY, Outcome.DONE]  # the rebalance only taints
    assert len(c.taints("spot-0")) == 1  # what succeeded stays
    assert c.record("web") is None and surge_copy(c, "web") is None  # nothing half-written
    c.sim.faults.clear()
    c.sim.faults.set(verb=verb, resource=res, error_rate=1.0, status=409)
    assert h.handle([c.notice("spot-0")]) == [Outcome.RETRY]  # a conflict that never clears
    assert c.record("web") is None and surge_copy(c, "web") is None
    c.sim.faults.clear()
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert c.record("web")["surge"] == 1
    assert_surged(c, "web", 3, 1, copy)
    c.sim.faults.set(verb="list", resource="*", error_rate=1.0, status=500)
    quick = Handler(c.kube.with_policy(retry.Policy(attempts=2, deadline=2.0, base_delay=0.01)), mode(copy))
    assert quick.handle([c.notice("spot-0")]) == [Outcome.RETRY]  # the cluster cannot be read


def test_a_conflict_is_replanned(cluster: Cluster) -> None:
    """The replica surge: someone scales web between the read and the write: the patch answers
    409 (stale resourceVersion); the handler reads it again and surges from the new count."""
    c = cluster
    h = c.handler(config=mode(False))
    snapshot = h.snapshot()
    c.kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, "shop")
    h.snapshot = lambda **_: snapshot  # type: ignore[method-assign]
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert_surged(c, "web", 5, 1, copy=False)
    assert c.record("web")["replicas"] == 5


def test_a_copy_made_since_the_read_is_replanned_on_its_record(cluster: Cluster) -> None:
    """A copy's surge writes the copy and its record in one conditional write: where another
    pass made the copy since this one read (another instance handling spot-1's notice), the
    create answers AlreadyExists, and the handler reads the copy again and plans on its record:
    both nodes covered, one record, never the other pass's notice lost."""
    c = cluster
    h = c.handler()
    snapshot = h.snapshot()
    assert c.handler().handle([c.notice("spot-1")]) == [Outcome.DONE]
    assert c.record("web")["nodes"] == ["spot-1"]
    h.snapshot = lambda **_: snapshot  # type: ignore[method-assign]
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    web = c.record("web")
    assert web["nodes"] == ["spot-0", "spot-1"] and web["surge"] == 2, web
    assert web["events"] == ["interruption-spot-1", "interruption-spot-0"], web
    assert_surged(c, "web", 3, 2, copy=True)
    assert c.kube.stats.count("create", "replicasets.apps") == 3  # web's and single's, then web's refused
    assert c.kube.stats.count("patch", "replicasets.apps") == 1  # web's, on the copy as read again


def test_a_copy_surge_made_from_a_stale_count_is_resized_by_the_next_pass(cluster: Cluster) -> None:
    """The owner scales web from 3 to 2 between the read and the copy's write. A copy's surge
    does not write the Deployment (no conflict tells it): the copy is sized from the read (one
    replica, for the doomed pod of 3), one too many for 2, which web keeps on od-0 and
    spot-1; the next pass sizes it from the owner's count now: 0, the copy kept for its
    record while the surge runs. Money for one pass, never service."""
    c = cluster
    h = c.handler()
    snapshot = h.snapshot()
    c.kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 2}}, "shop")
    h.snapshot = lambda **_: snapshot  # type: ignore[method-assign]
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert surge_copy(c, "web")["spec"]["replicas"] == 1
    del h.snapshot
    h.reconcile()
    assert surge_copy(c, "web")["spec"]["replicas"] == 0
    assert not c.record("web").get("done")
    assert_surged(c, "single", 1, 1, copy=True)


def test_left_over_budgets_are_deleted(cluster: Cluster) -> None:
    c = cluster
    c.store.apply_objects(
        [
            {
                **sc.pdb("spotguard-surge-web", "web", min_available=3),
                "metadata": {
                    "name": "spotguard-surge-web",
                    "namespace": "shop",
                    "labels": {"app.kubernetes.io/managed-by": "spotguard"},
                },
            },
            sc.pdb("spotguard-surge-users-own", "web", min_available=1),  # not labelled: the user's
        ]
    )
    c.handler().reconcile()  # too young to be a leftover
    assert len(c.store.list("poddisruptionbudgets")[0]) == 2
    c.handler(clock=lambda: c.now() + 300).reconcile()
    assert [b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets")[0]] == ["spotguard-surge-users-own"]


def test_instance_found_by_its_private_dns_name(cluster: Cluster, moto_server: Any) -> None:
    c = cluster
    ec2 = moto_server.client("ec2")
    image = ec2.describe_images()["Images"] or []
    ami = image[0]["ImageId"] if image else "ami-12c6146b"
    instance = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"][0]
    dns = instance["PrivateDnsName"]
    node = sc.node(dns, "spot")
    node["spec"]["providerID"] = ""  # a node whose providerID says nothing
    c.store.apply_objects([node, pod(c.deployment("web"), 7, dns)])
    h = c.handler(ec2=ec2)
    n = Notice("ev-dns", NoticeKind.INTERRUPTION, instance["InstanceId"], datetime.now(UTC))
    foreign = Notice("ev-other", NoticeKind.INTERRUPTION, "i-00000000000000000", datetime.now(UTC))
    assert h.handle([n, foreign]) == [Outcome.DONE, Outcome.IGNORED]
    assert c.taints(dns) == [{"key": "spotguard.io/interruption", "value": "ev-dns", "effect": "NoSchedule"}]
    assert c.record("web")["nodes"] == [dns]


def test_ec2_unreachable_retries_the_unmatched(cluster: Cluster) -> None:
    import boto3
    from botocore.config import Config as BotoConfig

    c = cluster
    ec2 = boto3.client(
        "ec2",
        endpoint_url="http://127.0.0.1:9",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=BotoConfig(retries={"max_attempts": 1}, connect_timeout=1),
    )
    n = Notice("ev-u", NoticeKind.INTERRUPTION, "i-0fffffffffffffff0", datetime.now(UTC))
    assert c.handler(ec2=ec2).handle([n, c.notice("spot-0")]) == [Outcome.RETRY, Outcome.DONE]


def test_from_environment(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", cluster.sim.kubeconfig)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("SPOTGUARD_REBALANCE_ACTION", "surge")
    h = Handler.from_environment()
    assert h.ec2 is not None and h.ec2.meta.region_name == "eu-west-1"
    assert h.config.rebalance_action is config.RebalanceAction.SURGE
    assert h.config.surge_copy is True  # the default
    assert h.handle([cluster.notice("spot-0", NoticeKind.REBALANCE)]) == [Outcome.DONE]
    assert_surged(cluster, "web", 3, 1, copy=True)


def test_metrics_count_notices_surges_and_the_time_to_surge(cluster: Cluster) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (
        value("spotguard_interruption_notices_total", kind="interruption", outcome="done"),
        value("spotguard_interruption_notices_total", kind="interruption", outcome="ignored"),
        value("spotguard_interruption_surges_total", unit="workloads"),
        value("spotguard_interruption_surges_total", unit="replicas"),
        value("spotguard_interruption_notice_to_surge_seconds_count"),
        value("spotguard_interruption_taints_total"),
    )
    c = cluster
    foreign = Notice("ev-f", NoticeKind.INTERRUPTION, "i-0aaaaaaaaaaaaaaaa", datetime.now(UTC))
    c.handler().handle([c.notice("spot-0"), foreign])
    after = (
        value("spotguard_interruption_notices_total", kind="interruption", outcome="done"),
        value("spotguard_interruption_notices_total", kind="interruption", outcome="ignored"),
        value("spotguard_interruption_surges_total", unit="workloads"),
        value("spotguard_interruption_surges_total", unit="replicas"),
        value("spotguard_interruption_notice_to_surge_seconds_count"),
        value("spotguard_interruption_taints_total"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 2, 2, 2, 1]


def test_scale_back_ranks_dead_pods_before_a_node_added_moves_pod(cluster: Cluster) -> None:
    """A node-added move in progress at the notice has ranked one living on-demand pod
    first to go (``FIRST_TO_GO``). At the scale back the doomed pod (its instance
    terminated, the API still Ready for the node lifecycle grace) must rank strictly
    below it: on a tie the ReplicaSet's next criterion (doubled-up pods first) removed the
    move's serving pod and kept the dead one (tests/chaos webhook-down: fresh 5 -> 4)."""
    # replica surge (surge_copy=False): the deletion-cost ranking of the scale back.
    c = cluster
    h = c.handler(config=replica_mode(), clock=lambda: c.now() + 200)  # past the reclaim (two minutes after the notice)
    c.handler(config=replica_mode()).handle([c.notice("spot-0")])
    assert c.deployment("web")["spec"]["replicas"] == 4
    move_pod = "web-5d4f8-00000"
    c.store.mutate(
        "pods",
        move_pod,
        "shop",
        lambda p: p["metadata"].setdefault("annotations", {}).update({DELETION_COST: str(moves.FIRST_TO_GO)}),
    )
    c.store.apply_objects([pod(c.deployment("web"), 10, "od-0")])
    h.reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    pods = [p for p in c.store.list("pods", "shop")[0] if p["metadata"]["name"].startswith("web-")]
    # The move's pod shares od-0 with the replacement: doubled up, as in the chaos run.
    ranks = [2 if p["spec"]["nodeName"] == "od-0" else 1 for p in pods]
    order = [p["metadata"]["name"] for p in pod_util.deletion_order(pods, ranks, c.now())]
    assert order[0] == "web-5d4f8-00001", order  # the pod on spot-0 goes, not the move's


def test_an_interruption_whose_node_mark_failed_still_ranks_its_dead_pods_first(cluster: Cluster) -> None:
    """A rebalance surge, then the interruption warning for the same node while every node write
    answers 500: the node keeps its rebalance mark (the rewrite is retried) but the surge record
    takes the interruption's deadline. Past the reclaim the scale back must still rank the dead
    node's pods first to go (chaos drainer-after-rebalance-surge under 500s: web 6 -> 5 at the
    scale back, when the stale mark made them count as pods of a living node)."""
    # replica surge (surge_copy=False): the deletion-cost ranking of the scale back.
    c = cluster
    cfg = replica_mode(rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=900)
    c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)])
    record = c.record("web")
    assert record is not None and record["rebalance"] == ["spot-0"]
    c.sim.faults.set(verb="patch", resource="nodes", error_rate=1.0, status=500)
    assert c.handler(config=cfg).handle([c.notice("spot-0")]) == [Outcome.RETRY]
    c.sim.faults.clear()
    record = c.record("web")
    assert record is not None and record["rebalance"] == []
    mark = json.loads(c.store.get("nodes", "spot-0")["metadata"]["annotations"]["spotguard.io/notice"])
    assert mark["kind"] == "rebalance"  # the node's own mark is stale
    c.store.apply_objects([pod(c.deployment("web"), 10, "od-0")])  # the replacement, Ready
    c.handler(config=cfg, clock=lambda: c.now() + 200).reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    dead = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert dead["metadata"]["annotations"][DELETION_COST] == str(moves.DOOMED_FIRST)


def _rebalance_then_interruption(c: Cluster, cfg: config.Config, *fail: tuple[str, str]) -> Handler:
    """A rebalance surge for spot-0 (its end at +120 s), then at +80 s the interruption warning
    (reclaim at +200 s) while every request of ``fail`` (verb, resource) answers 500. Returns
    the handler that took the warning. In copy mode the surge replica is the copy's pod."""
    c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)])
    assert c.record("web")["rebalance"] == ["spot-0"]
    assert_surged(c, "web", 3, 1, cfg.surge_copy)
    at = c.now() + 80
    warning = Notice("ev-late", NoticeKind.INTERRUPTION, sc.instance_id("spot-0"), datetime.fromtimestamp(at, UTC))
    for verb, resource in fail:
        c.sim.faults.set(verb=verb, resource=resource, error_rate=1.0, status=500)
    h = c.handler(config=cfg, clock=lambda: c.now() + 80)
    assert h.handle([warning]) == [Outcome.RETRY]
    c.sim.faults.clear()
    assert c.record("web")["rebalance"] == ["spot-0"]  # the takeover was not written
    surge = copy_pod(c, "web", 10, "od-0") if cfg.surge_copy else pod(c.deployment("web"), 10, "od-0")
    surge["metadata"]["annotations"] = {"spotguard.io/surge-replica": "true"}
    c.store.apply_objects([surge])  # the surge replica, Ready
    return h


def copy_pod(c: Cluster, name: str, index: int, node: str) -> Obj:
    """A pod of ``name``'s surge copy (owned by the copy, labelled as its template says)."""
    rs = surge_copy(c, name)
    assert rs is not None, f"no surge copy of {name}"
    out = pod(c.deployment(name), index, node)
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"], "uid": "copy"}
    out["metadata"].update(
        name=f"{rs['metadata']['name']}-{index:05d}",
        labels=dict(rs["spec"]["template"]["metadata"]["labels"]),
        ownerReferences=[{**ref, "controller": True}],
    )
    return out


def replaced(c: Cluster, dead: str, name: str, index: int, node: str) -> None:
    """The node lifecycle controller removed ``dead``; the Deployment's replacement is Ready on ``node``."""
    c.store.remove("pods", dead, "shop")
    c.store.apply_objects([pod(c.deployment(name), index, node)])


@MODES
def test_a_rebalance_surge_holds_past_its_end_when_the_node_mark_says_a_reclaim_follows(
    cluster: Cluster, copy: bool
) -> None:
    """The warning came 80 s after the recommendation; its write to the workload failed (it is
    retried), its node mark did not. Another process's reconcile (node-added's) past the
    rebalance's end must not end the surge while the doomed pod still serves: the record alone
    said the node lives on (chaos drainer-after-rebalance-surge under timeouts, cart 4 -> 3)."""
    c = cluster
    cfg = mode(copy, rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=120)
    _rebalance_then_interruption(c, cfg, record_write(copy))
    mark = json.loads(c.store.get("nodes", "spot-0")["metadata"]["annotations"]["spotguard.io/notice"])
    assert (mark["kind"], mark["event"]) == ("interruption", "ev-late")
    other = c.handler(config=cfg, clock=lambda: c.now() + 130)
    other.reconcile()
    assert_surged(c, "web", 3, 1, copy)
    # The reconcile re-planned the pending notice from the node's mark: the takeover is written.
    assert c.record("web")["rebalance"] == []
    dying = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert DELETION_COST not in (dying["metadata"].get("annotations") or {})
    if copy:
        # Past the reclaim the copy stands in for the dead pod until the Deployment's own
        # replacement is Ready on a node that stays; then it goes.
        c.handler(config=cfg, clock=lambda: c.now() + 210).reconcile()
        assert_surged(c, "web", 3, 1, copy)
        assert not c.record("web").get("done")
        replaced(c, "web-5d4f8-00001", "web", 11, "od-0")
        c.handler(config=cfg, clock=lambda: c.now() + 215).reconcile()
        assert_surged(c, "web", 3, 0, copy)
        return
    # replica surge (surge_copy=False): past the reclaim the dead node's pod goes first, not the surge replica.
    c.handler(config=cfg, clock=lambda: c.now() + 210).reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    dying = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert dying["metadata"]["annotations"][DELETION_COST] == str(moves.DOOMED_FIRST)


@MODES
@pytest.mark.parametrize(
    "fail",
    [(("record",), ("patch", "nodes")), (("list", "*"),)],
    ids=["every-write-failed", "the-read-failed"],
)
def test_a_rebalance_surge_holds_while_this_process_retries_the_reclaim_it_could_not_write(
    cluster: Cluster, fail: tuple[tuple[str, ...], ...], copy: bool
) -> None:
    """Neither the node's mark nor the workload's record took the warning (every write failed,
    or the read before the plan did): only the handler retrying it knows the reclaim. Its own
    reconciles (`serve spot-interruption` runs one every 15 s beside the poller) hold the surge
    and the node's taint until the reclaim, instead of treating the node as a rebalance's
    survivor (chaos drainer-after-rebalance-surge under timeouts: web 6 -> 4)."""
    c = cluster
    cfg = mode(copy, rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=120)
    fail = tuple(record_write(copy) if f == ("record",) else f for f in fail)
    h = _rebalance_then_interruption(c, cfg, *fail)
    mark = json.loads(c.store.get("nodes", "spot-0")["metadata"]["annotations"]["spotguard.io/notice"])
    assert mark["kind"] == "rebalance"
    h.clock = lambda: c.now() + 130
    h.reconcile()
    assert_surged(c, "web", 3, 1, copy)
    h.clock = lambda: c.now() + 185  # past the rebalance's end and its staleness: still tainted
    h.reconcile()
    assert [t["value"] for t in c.taints("spot-0")] == ["rebalance-spot-0"]
    assert_surged(c, "web", 3, 1, copy)
    if copy:
        # Past the reclaim the copy stands in for the dead pod until the Deployment's own
        # replacement is Ready on a node that stays; then it goes.
        h.clock = lambda: c.now() + 210
        h.reconcile()
        assert_surged(c, "web", 3, 1, copy)
        replaced(c, "web-5d4f8-00001", "web", 11, "od-0")
        h.clock = lambda: c.now() + 215
        h.reconcile()
        assert_surged(c, "web", 3, 0, copy)
        return
    # replica surge (surge_copy=False): past the reclaim the dead node's pod goes first
    h.clock = lambda: c.now() + 210
    h.reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    dying = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert dying["metadata"]["annotations"][DELETION_COST] == str(moves.DOOMED_FIRST)


@MODES
def test_the_node_added_pass_leaves_a_rebalance_surge_to_the_function_that_may_hold_its_reclaim(
    cluster: Cluster, copy: bool
) -> None:
    """Every write of the warning failed: the cluster still says "rebalance" for spot-0, and only
    the spot-interruption process retrying the warning knows the reclaim. The node-added pass
    (another process, its own schedule) must not end that surge at the rebalance's end (chaos
    drainer-after-rebalance-surge under timeouts: its scale back, then cart 4 -> 3); the
    spot-interruption function's own reconcile decides. (One that does not hold the warning, its
    message redelivered to another process, ends it: all the cluster says is "rebalance".)"""
    c = cluster
    cfg = mode(copy, rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=120)
    _rebalance_then_interruption(c, cfg, record_write(copy), ("patch", "nodes"))
    pass_ = reconciler.Reconciler(c.kube, cfg, clock=lambda: c.now() + 130)
    assert pass_.reconcile(dry_run=True).surges_over == []
    pass_.reconcile()
    assert_surged(c, "web", 3, 1, copy)
    # A fresh spot-interruption handler (its notice redelivered elsewhere) ends it as over.
    c.handler(config=cfg, clock=lambda: c.now() + 130).reconcile()
    assert_surged(c, "web", 3, 0, copy)


def test_a_surge_replica_the_webhook_let_through_unmarked_still_goes_first(cluster: Cluster) -> None:
    """Under API timeouts the webhook fails open: the surge's pod has no surge-replica mark and
    no on-demand deletion cost, like the spot pods. At the end of a rebalance-only surge it is
    still ranked first to go (created since the surge began), not a spot pod doubled up on the
    living node (chaos rebalance-storm-surge under timeouts: cart's pod on spot-1 went)."""
    # replica surge (surge_copy=False): the deletion-cost ranking of the scale back.
    c = cluster
    cfg = replica_mode(rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=60)
    c.store.apply_objects([pod(c.deployment("web"), 11, "spot-0")])  # doubled up on the living node
    c.sim.clock.advance(5)
    c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)])
    assert c.deployment("web")["spec"]["replicas"] == 5
    c.sim.clock.advance(5)
    unmarked = [pod(c.deployment("web"), i, "od-0") for i in (20, 21)]
    c.store.apply_objects(unmarked)
    c.handler(config=cfg, clock=lambda: c.now() + 400).reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    for p in unmarked:
        got = c.store.get("pods", p["metadata"]["name"], "shop")
        assert got["metadata"]["annotations"][DELETION_COST] == str(moves.SURGE_FIRST)
    for name in ("web-5d4f8-00001", "web-5d4f8-00011"):
        assert DELETION_COST not in (c.store.get("pods", name, "shop")["metadata"].get("annotations") or {})


def test_a_rebalance_only_surge_ends_by_removing_its_surge_replica_not_the_living_spot_pod(cluster: Cluster) -> None:
    """A rebalance recommendation never followed by an interruption: at the end of its surge
    the spot pod on the (living) node stays and the surge replica goes (tests/chaos
    rebalance-storm-surge: the ReplicaSet removed the doubled-up spot pods instead)."""
    # replica surge (surge_copy=False): the deletion-cost ranking of the scale back (the copy's
    # end: the test after this one).
    c = cluster
    cfg = replica_mode(rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=60)
    c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)])
    extra = pod(c.deployment("web"), 10, "od-0")
    extra["metadata"]["labels"]["spotguard.io/placement"] = "on-demand"
    extra["metadata"]["annotations"] = {"spotguard.io/surge-replica": "true"}
    c.store.apply_objects([extra])
    c.handler(config=cfg, clock=lambda: c.now() + 400).reconcile()
    assert c.deployment("web")["spec"]["replicas"] == 3
    living = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert DELETION_COST not in (living["metadata"].get("annotations") or {})
    surge = c.store.get("pods", extra["metadata"]["name"], "shop")
    assert surge["metadata"]["annotations"][DELETION_COST] == str(moves.SURGE_FIRST)
    pods = [p for p in c.store.list("pods", "shop")[0] if p["metadata"]["name"].startswith("web-")]
    on_node = [p["spec"]["nodeName"] for p in pods]
    ranks = [on_node.count(n) for n in on_node]  # the ReplicaSet's doubled-up rank
    order = [p["metadata"]["name"] for p in pod_util.deletion_order(pods, ranks, c.now())]
    assert order[0] == extra["metadata"]["name"], order


def test_a_rebalance_only_surge_ends_with_its_copy_at_the_rebalances_end(cluster: Cluster) -> None:
    """A rebalance recommendation never followed by an interruption, in copy mode: at the end
    of its surge the node lives on and its pod serves, so the Deployment serves its count on
    nodes that stay; the copy goes then (not 300 s later, waiting for replacements of a pod
    that never dies) and the spot pod stays. A reclaim the handler still retries for the node
    keeps it (test_a_rebalance_surge_holds_while_this_process_retries_the_reclaim_it_could_not_write)."""
    c = cluster
    cfg = mode(True, rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=60)
    c.handler(config=cfg).handle([c.notice("spot-0", NoticeKind.REBALANCE)])
    assert_surged(c, "web", 3, 1, copy=True)
    extra = copy_pod(c, "web", 10, "od-0")
    c.store.apply_objects([extra])
    c.handler(config=cfg, clock=lambda: c.now() + 30).reconcile()  # before its end: kept
    assert_surged(c, "web", 3, 1, copy=True)
    c.handler(config=cfg, clock=lambda: c.now() + 70).reconcile()
    assert_surged(c, "web", 3, 0, copy=True)
    assert c.record("web") is None or c.record("web")["done"] is True
    living = c.store.get("pods", "web-5d4f8-00001", "shop")
    assert DELETION_COST not in (living["metadata"].get("annotations") or {})
    assert c.deployment("web")["spec"]["replicas"] == 3


def test_a_taint_write_answered_500_once_is_written_again_at_once(cluster: Cluster) -> None:
    """A 500 on the taint (which may hide a write that happened): the taint and its mark are
    the same whoever writes them twice, so the handler writes again within the handling
    instead of leaving the node open (and a drainer's grace running out) until the notice's
    redelivery: chaos drainer-at-notice under 500s lost api and worker replicas that way."""
    c = cluster
    c.sim.faults.set(verb="patch", resource="nodes", error_rate=1.0, status=500, before=c.sim.faults.clear)
    assert c.handler().handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert c.sim.faults.injected == 1
    assert [t["value"] for t in c.taints("spot-0")] == ["interruption-spot-0"]


def test_the_nodes_are_marked_while_the_rest_of_the_cluster_is_still_read(cluster: Cluster) -> None:
    """The taint and the notice beside it are written as soon as the nodes are read, not
    after every list: a drainer ahead of spotguard meets the guard's short grace (8 s) for a
    going-away spot node without spotguard's notice, and under hung requests the whole read
    took 12 to 40 s (chaos aborted-drain under timeouts in copy mode: the guard let the
    drainer take one of worker's serving pods before the mark, worker 8 -> 7)."""
    c = cluster
    seen: list[bool] = []

    def workloads_listed() -> None:  # the handling's read of the Deployments, held until spot-0 is marked
        deadline = time.monotonic() + 5
        while not c.taints("spot-0") and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(bool(c.taints("spot-0")))

    c.sim.faults.set(verb="list", resource="deployments", before=workloads_listed)
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert seen == [True]
    assert [t["value"] for t in c.taints("spot-0")] == ["interruption-spot-0"]
    assert c.kube.stats.count("patch", "nodes") == 1  # written once: the plan does not write it again
    assert c.record("web")["nodes"] == ["spot-0"]


def test_a_reconcile_with_nothing_to_do_never_holds_a_notice_back(cluster: Cluster) -> None:
    """The served process serializes the handlings and the reconciles; the reconcile's cheap
    look (is there anything to reconcile?) only reads, and is taken before its turn. Under
    hung requests the look held the turn 6 to 19 s of every 15 while nothing was to do, and a
    notice arriving meanwhile waited for it (chaos aborted-drain under timeouts)."""
    c = cluster
    served = dispatch.Serialized(c.handler())
    looking, handled = threading.Event(), threading.Event()
    calls: list[bool] = []

    def deployments_listed() -> None:  # the look's read of the Deployments hangs until the notice is handled
        calls.append(True)
        if len(calls) == 1:
            looking.set()
            calls[0] = handled.wait(10)

    c.sim.faults.set(verb="list", resource="deployments", before=deployments_listed)
    reconcile = threading.Thread(target=served.reconcile)
    reconcile.start()
    assert looking.wait(10)
    assert served.handle([c.notice("spot-0")]) == [Outcome.DONE]
    handled.set()
    reconcile.join(20)
    assert calls[0] is True, "the notice waited for the reconcile's look"
    assert [t["value"] for t in c.taints("spot-0")] == ["interruption-spot-0"]


def _metric(name: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0


def _hold_until_waiting(served: dispatch.Serialized, start: Any) -> Any:
    """A fault hook: the first time, start ``start`` (another handling) and hold the request
    until that handling waits for the turn."""
    fired: list[threading.Thread] = []

    def hook() -> None:
        if fired:
            return
        fired.append(threading.Thread(target=start))
        fired[0].start()
        deadline = time.monotonic() + 10
        while not served.notices_waiting():
            assert time.monotonic() < deadline, "the second handling never waited"
            time.sleep(0.01)

    hook.fired = fired  # type: ignore[attr-defined]
    return hook


def test_a_handling_that_notices_wait_for_leaves_its_upkeep_and_events_to_later(cluster: Cluster) -> None:
    """Notices first (chaos one-after-another under timeouts: a handling spent 26 s on Events
    and the ledger after its last surge, while two warnings waited; their surges came 10 to
    20 s before the reclaims, too late to be Ready). GIVEN spot-0's warning being handled,
    WHEN spot-1's arrives while spot-0's surges are written, THEN spot-0's handling ends at
    its surges (its upkeep left to the next pass, its Events posted in the background), and
    spot-1's handling does the upkeep: both nodes' surges, the ledger and the Events are there."""
    from spotguard.interruption import ledger

    c = cluster
    h = c.handler()
    served = dispatch.Serialized(h)
    second: list[Any] = []
    hook = _hold_until_waiting(served, lambda: second.append(served.handle([c.notice("spot-1")])))
    c.sim.faults.set(verb="create", resource="replicasets", before=hook)
    deferred = _metric("spotguard_interruption_upkeeps_deferred_total")
    assert served.handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert _metric("spotguard_interruption_upkeeps_deferred_total") == deferred + 1
    hook.fired[0].join(30)
    assert second == [[Outcome.DONE]]
    assert _metric("spotguard_interruption_upkeeps_deferred_total") == deferred + 1  # the second did its own
    assert {t["value"] for t in c.taints("spot-0") + c.taints("spot-1")} == {
        "interruption-spot-0", "interruption-spot-1"}
    assert set(c.record("web")["nodes"]) == {"spot-0", "spot-1"}
    assert {"Deployment/shop/web", "Deployment/shop/single"} <= set(ledger.read(c.kube))
    h.flush(10)
    nodes = {e["involvedObject"]["name"] for e in c.store.list("events")[0] if e["reason"] == "SpotInterruption"}
    assert nodes == {"spot-0", "spot-1"}


def test_a_reconcile_that_a_notice_waits_for_stops_before_its_upkeep(cluster: Cluster) -> None:
    """A reconcile under hung requests held a notice 13 s; one that a notice waits for once it
    has read the cluster stops before its upkeep (the next pass does it)."""
    c = cluster
    h = c.handler()
    served = dispatch.Serialized(h)
    assert served.handle([c.notice("spot-0")]) == [Outcome.DONE]  # a surge in progress: something to reconcile
    handled: list[Any] = []
    hook = _hold_until_waiting(served, lambda: handled.append(served.handle([c.notice("spot-1")])))
    c.sim.faults.set(verb="list", resource="pods", before=hook)
    deferred = _metric("spotguard_interruption_upkeeps_deferred_total")
    served.reconcile()
    assert _metric("spotguard_interruption_upkeeps_deferred_total") == deferred + 1
    hook.fired[0].join(30)
    assert handled == [[Outcome.DONE]]
    assert set(c.record("web")["nodes"]) == {"spot-0", "spot-1"}


def copy_mode() -> config.Config:
    return dataclasses.replace(config.Config(), surge_copy=True)


def dropped_once(c: Cluster, verb: str, resource: str, before: Any = None) -> None:
    """The next ``verb`` of ``resource`` held and dropped without an answer (a timeout)."""
    once = before or c.sim.faults.clear
    c.sim.faults.set(verb=verb, resource=resource, timeout=True, error_rate=1.0, hold_seconds=0.05, before=once)


def surge_copy(c: Cluster, name: str) -> Obj | None:
    items = c.store.list("replicasets", namespace="shop")[0]
    return next((rs for rs in items if rs["metadata"]["name"] == surge_copy_name(name)), None)


def test_a_surge_copy_create_that_timed_out_is_created_again_at_once(cluster: Cluster) -> None:
    """A create of the surge copy held and dropped (a timeout: the copy may or may not have
    been made): made under a fixed name, it is created again within the handling, not at the
    notice's redelivery. Under 20 % hung requests a lost create cost a handling, a reconcile
    and a redelivery (the copy at +58 s instead of +20 s; after two lost creates it was not
    serving by the reclaim: chaos gitops-revert in copy mode, cart 4 -> 2)."""
    c = cluster
    dropped_once(c, "create", "replicasets")
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert c.sim.faults.injected == 1
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 1  # web's pod on spot-0
    assert c.record("web")["copy"] is True and c.deployment("web")["spec"]["replicas"] == 3


def test_a_surge_copy_created_though_its_answer_was_lost_is_kept(cluster: Cluster) -> None:
    """The create was made but its answer lost (a connection dropped after the server acted):
    the create tried again answers AlreadyExists, the copy made is kept, and the handling is
    done (not retried for a write that happened)."""
    c = cluster

    made = threading.Lock()

    def made_then_dropped() -> None:
        # (web's and single's creates run at once: both may meet the rule; web's copy is made once.)
        c.sim.faults.clear()
        if not made.acquire(blocking=False):
            return
        web = {**c.deployment("web"), "kind": "Deployment"}
        body = surgecopy.build(web, 1, copy_mode())
        assert isinstance(body, dict)
        c.store.create("replicasets", body, namespace="shop")

    dropped_once(c, "create", "replicasets", before=made_then_dropped)
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert c.sim.faults.injected >= 1
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 1
    # The copy made by the lost create is read again and given the record.
    assert c.record("web")["nodes"] == ["spot-0"]


def test_a_pass_that_read_before_the_copy_was_made_never_shrinks_it(cluster: Cluster) -> None:
    """node-added carries out the copy steps on its own snapshot at the end of its pass, tens
    of seconds after its read under hung requests (chaos aborted-drain under timeouts: its
    create of web's copy answered AlreadyExists 6 s after spot-interruption made it, and it
    set the copy's size from its own count). GIVEN a read where web's record covers spot-0
    only and no copy is listed yet, WHEN the record has since grown to spot-1 too and the
    copy to 2, THEN the pass on the old read leaves the copy at 2 (its count, 1, would leave
    web's pod on spot-1 without a replacement at the reclaim); a copy smaller than its count
    is grown."""
    c = cluster
    h = c.handler(config=copy_mode())
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    read = h.snapshot()
    # The copies were listed before the copy was made, the workloads after: the read built
    # again with no copy, each Deployment carrying its record as the plans saw it on its copy
    # (not the ledger's stand-in, which a plan writes again).
    on_copies = read.copy_records(done=True)
    old = dataclasses.replace(
        read,
        copies={},
        workloads={key: _carrying(raw, on_copies.get(key)) for key, raw in read.workloads.items()},
    )
    assert old.copy_records(done=True) == {} and not old.lost
    seen = surges.SurgeRecord.of(next(w for w in old.workload_views if w.key == "Deployment/shop/web"))
    assert seen is not None and list(seen.nodes) == ["spot-0"] and not seen.lost
    assert h.handle([c.notice("spot-1")]) == [Outcome.DONE]
    assert c.record("web")["nodes"] == ["spot-0", "spot-1"]
    assert surge_copy(c, "web")["spec"]["replicas"] == 2
    c.handler(config=copy_mode()).reconcile(old)
    assert surge_copy(c, "web")["spec"]["replicas"] == 2
    c.store.mutate("replicasets", surge_copy_name("web"), "shop", lambda rs: rs["spec"].update(replicas=0))
    c.handler(config=copy_mode()).reconcile(old)
    assert surge_copy(c, "web")["spec"]["replicas"] == 1  # its own count: grown, not shrunk


def _carrying(raw: dict[str, Any], record: surges.SurgeRecord | None) -> dict[str, Any]:
    """``raw`` with ``record`` as its own surge record (annotation), as the plans see it."""
    if record is None:
        return raw
    meta = raw.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), SURGE: surgecopy.plain(record)}
    return {**raw, "metadata": {**meta, "annotations": annotations}}


def test_a_reconcile_takes_one_copy_step_per_surge(cluster: Cluster) -> None:
    """A reconcile that plans a pending notice again carries out the copy's step with the
    surge, and not a second time in its upkeep: the second create answered AlreadyExists and
    was one more request (each hung one holds the reconcile's turn 6 s under timeouts)."""
    c = cluster
    h = c.handler(config=copy_mode())
    c.sim.faults.set(verb="create", resource="replicasets", timeout=True, error_rate=1.0, hold_seconds=0.01)
    assert h.handle([c.notice("spot-0")]) == [Outcome.RETRY]  # the copies could not be made
    c.sim.faults.clear()
    # Nothing half-written: the record is the copy's, made in the same write.
    assert c.taints("spot-0") and c.record("web") is None and surge_copy(c, "web") is None
    creates = c.kube.stats.count("create", "replicasets.apps")
    h.reconcile()
    assert surge_copy(c, "web") is not None and surge_copy(c, "single") is not None
    assert c.record("web")["nodes"] == ["spot-0"]
    assert c.kube.stats.count("create", "replicasets.apps") - creates == 2  # web's and single's, once each


@pytest.mark.parametrize("made", [False, True], ids=["dropped", "made-then-dropped"])
def test_a_surge_record_write_that_timed_out_is_written_again_at_once(cluster: Cluster, made: bool) -> None:
    """A later notice's write of the record on the copy (a replace guarded by the copy's
    resourceVersion) held and dropped: it is written again within the handling. Where the
    server acted on it, or anyone wrote the copy meanwhile, the write again answers Conflict:
    the copy is read again and the workload planned on its record."""
    c = cluster
    h = c.handler(config=copy_mode())
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    name = surge_copy_name("web")

    def bumped() -> None:
        c.sim.faults.clear()
        c.store.mutate("replicasets", name, "shop", lambda rs: rs["metadata"].setdefault("labels", {}).update(x="y"))

    dropped_once(c, "patch", "replicasets", before=bumped if made else None)
    assert h.handle([c.notice("spot-1")]) == [Outcome.DONE]
    assert c.sim.faults.injected == 1
    web = c.record("web")
    assert web["copy"] is True and web["nodes"] == ["spot-0", "spot-1"] and web["surge"] == 2, web
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 2


def test_a_temporary_budget_create_that_timed_out_is_created_again_at_once(cluster: Cluster) -> None:
    """The temporary budget is what a drainer at the notice meets first; a create of it held
    and dropped is made again within the handling (a fixed name: made already, AlreadyExists)."""
    c = cluster
    dropped_once(c, "create", "poddisruptionbudgets")
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert c.sim.faults.injected == 1
    budgets = {b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets", namespace="shop")[0]}
    assert budgets == {"spotguard-surge-web", "spotguard-surge-single"}


def test_a_notice_retried_after_a_surges_end_put_the_limits_back_does_not_raise_them_again(
    cluster: Cluster,
) -> None:
    """A surge's end is several writes: the autoscaler's limits back, the budget deleted, the
    scale back with the record. Under 20 % 500s an end put api's minimum back, failed at the
    budget, and a retried notice read the surge still running with the minimum below the
    surged count: it raised it again, the retried end (its snapshot from before that raise)
    found nothing of its own to restore, and the autoscaler held the surged count for good
    (chaos consolidation-after-reclaim). The end marks the autoscaler in the same patch."""
    # replica surge (surge_copy=False): the autoscaler's limits raised and put back (a copy's
    # surge never touches them: test_a_copy_surge_ends_keeping_the_users_change_and_leaving_nothing).
    c = cluster
    h = c.handler(config=replica_mode())
    h.handle([c.notice("spot-0")])
    record = c.record("single")
    assert record is not None and c.store.get("horizontalpodautoscalers", "single", "shop")["spec"]["minReplicas"] == 2
    # WHEN an end's first write is done (as _restore_autoscaler writes it) and the rest failed
    key = f"{float(record['started']):.3f}"
    c.kube.patch(r.HPAS, "single", {"spec": {"minReplicas": 1, "maxReplicas": 1}, "metadata": {"annotations": {
        interruption.HPA_SET_MIN: None, interruption.HPA_SET_MAX: None, interruption.HPA_RESTORED: key}}}, "shop")
    # AND the notice is handled again
    h.handle([c.notice("spot-0")])
    # THEN the limits stay where the end put them
    hpa = c.store.get("horizontalpodautoscalers", "single", "shop")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 1)
    # AND the end, once the replacement serves, scales back with nothing raised left
    c.store.apply_objects([pod(c.deployment("single"), 10, "od-0")])
    c.set_ready("single-5d4f8-00000", False)
    h.reconcile()
    assert c.deployment("single")["spec"]["replicas"] == 1
    hpa = c.store.get("horizontalpodautoscalers", "single", "shop")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 1)


def test_a_record_a_replace_took_while_the_ledger_could_not_be_written_stands_in_from_its_copy(
    cluster: Cluster,
) -> None:
    """Chaos argocd-replace-drainer under 500s (worker 8 -> 7 at +87 s): a Replace=true sync took
    the surge records while the ledger's writes failed; the next plan saw no surge, surged
    again from what it saw then (the pods the drainer had evicted not counted) and shrank the
    copy from 7 to 2 while the Deployment's own replacements were still starting. The copy
    carries its surge's record (surgecopy.RECORD): the plans read it as a ledger entry.
    GIVEN web 3 (od-0, spot-0, spot-1) surged by a copy of 2, its ledger write failed, WHEN
    its manifest is replaced (annotations gone) and the drainer's eviction took its pod on
    spot-0, THEN neither the reconcile nor the notice handled again shrinks or sweeps the
    copy: 2, until the Deployment's own replacements serve."""
    c = cluster
    h = c.handler(config=copy_mode())
    for verb in ("create", "update", "patch"):
        c.sim.faults.set(verb=verb, resource="configmaps", error_rate=1.0, status=500)
    assert h.handle([c.notice("spot-0"), c.notice("spot-1")]) == [Outcome.DONE, Outcome.DONE]
    c.sim.faults.clear()
    from spotguard.interruption import ledger

    assert ledger.read(c.kube) == {}  # the ledger write failed
    copy_rs = surge_copy(c, "web")
    assert copy_rs is not None and copy_rs["spec"]["replicas"] == 2
    record = surges.SurgeRecord.parse(json.dumps(c.record("web")))
    c.store.mutate("deployments", "web", "shop", lambda d: d["metadata"].update(annotations={}))
    spot_0_pod = next(
        p["metadata"]["name"]
        for p in c.store.list("pods", "shop")[0]
        if p["metadata"]["name"].startswith("web") and p["spec"].get("nodeName") == "spot-0"
    )
    c.store.delete("pods", spot_0_pod, "shop")
    h.reconcile()
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 2, rs and rs["spec"]
    assert h.handle([c.notice("spot-1")]) == [Outcome.DONE]
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 2, rs and rs["spec"]
    assert surgecopy.record_of(rs) == record  # the record it carries, as written at its surge


def test_an_unreadable_ledger_fails_the_handling_its_notices_retried(cluster: Cluster) -> None:
    """The ledger is the only place a record a replace took survives: a plan made without it
    would surge again as if nothing were in progress. Unreadable, the handling is retried
    (it read as empty before)."""
    c = cluster
    c.sim.faults.set(verb="list", resource="configmaps", error_rate=1.0, status=500)
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.RETRY]
    assert surge_copy(c, "web") is None and c.record("web") is None
    c.sim.faults.clear()
    assert c.handler(config=copy_mode()).handle([c.notice("spot-0")]) == [Outcome.DONE]
    assert surge_copy(c, "web") is not None


def test_a_snapshots_pods_of_a_workload_are_its_own(cluster: Cluster) -> None:
    """The index the copy steps and the ends count over (Snapshot.pods_of) holds exactly the
    pods interruption.workload_key_of gives each workload; a copy's pods are nobody's own."""
    c = cluster
    h = c.handler(config=copy_mode())
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    web = {**c.deployment("web"), "kind": "Deployment"}
    body = surgecopy.build(web, 1, copy_mode())
    assert isinstance(body, dict)
    copy_pod = pod(web, 9, "od-0")
    copy_pod["metadata"]["labels"][SURGE_OF] = "web"
    copy_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": body["metadata"]["name"], "uid": "c-1"}
    ]
    c.store.apply_objects([copy_pod])
    snap = h.snapshot()
    keys = {interruption.workload_key_of(p) for p in snap.pod_views} - {None}
    assert keys >= {"Deployment/shop/web", "Deployment/shop/single", "StatefulSet/shop/db"}
    for key in keys:
        assert snap.pods_of(str(key)) == [p for p in snap.pod_views if interruption.workload_key_of(p) == key]
    assert all(p.labels.get(SURGE_OF) is None for p in snap.pods_of("Deployment/shop/web"))
    assert len(snap.pods_of("Deployment/shop/web")) == 3


def test_a_drain_only_copy_switches_to_on_demand_when_a_warning_comes_for_its_node(cluster: Cluster) -> None:
    """Karpenter drains spot-0 (its disruption taint): the reconcile's surge for it makes a copy
    of spot slots (a consolidation must not launch on-demand). Then the market's warning comes
    for spot-0: the copy is rewritten with the on-demand template (with its record), so its
    next pods go where no reclaim takes them; spot slots would wait for a spot launch that a
    reclaim wave may refuse. Before, the copy kept its spot-slot template for good."""
    c = cluster
    h = c.handler(config=copy_mode())
    c.store.mutate(
        "nodes",
        "spot-0",
        None,
        lambda n: n["spec"].setdefault("taints", []).append(
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
        ),
    )
    h.reconcile()
    rs = surge_copy(c, "web")
    assert rs is not None and surgecopy.spot_slots(rs) and not pinned_on_demand_or_none(rs), rs["spec"]["template"]
    assert c.record("web")["spotDrains"] == ["spot-0"]
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    rs = surge_copy(c, "web")
    assert rs is not None and not surgecopy.spot_slots(rs) and pinned_on_demand(rs), rs["spec"]["template"]
    web = c.record("web")
    assert not web.get("spotDrains") and "interruption-spot-0" in web["events"], web


def test_a_copys_own_pods_on_a_node_a_later_warning_dooms_get_replacements(cluster: Cluster) -> None:
    """Karpenter drains spot-0: web's copy is made of spot slots and its pod lands on spot-2,
    where web has no pod of its own. Then the market's warning comes for spot-2. The copy's
    pod there is one of web's serving replicas and dies at the reclaim; a ReplicaSet makes
    its replacement only once it is gone. So web's surge covers spot-2 too and the copy grows
    by one at the warning, with the on-demand template. Before, no surge step was planned for
    web (it has no pod of its own on spot-2): the copy stayed at 1 on spot slots and web
    served one fewer from the reclaim until the replacement started."""
    c = cluster
    h = c.handler(config=copy_mode())
    c.store.create("nodes", sc.node("spot-2", "spot"))
    c.store.mutate(
        "nodes",
        "spot-0",
        None,
        lambda n: n["spec"].setdefault("taints", []).append({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}),
    )
    h.reconcile()
    rs = surge_copy(c, "web")
    assert rs is not None and surgecopy.spot_slots(rs) and rs["spec"]["replicas"] == 1
    meta = rs["metadata"]
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta["name"], "uid": meta["uid"], "controller": True}
    c.store.create(
        "pods",
        {
            "metadata": {
                "name": meta["name"] + "-abcde",
                "namespace": "shop",
                "labels": dict(rs["spec"]["template"]["metadata"]["labels"]),
                "ownerReferences": [ref],
            },
            "spec": {"nodeName": "spot-2", "containers": [{"name": "c", "image": "pause"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        },
        namespace="shop",
    )
    assert h.handle([c.notice("spot-2")]) == [Outcome.DONE]
    web = c.record("web")
    assert web is not None and "spot-2" in web["nodes"] and web["counts"]["spot-2"] == 1, web
    rs = surge_copy(c, "web")
    assert rs is not None and rs["spec"]["replicas"] == 2, rs["spec"]["replicas"]
    assert pinned_on_demand(rs) and not surgecopy.spot_slots(rs)
    # The reclaim: spot-2 and the copy's pod there are gone; the copy keeps the one the drain needs.
    c.store.remove("pods", meta["name"] + "-abcde", "shop")
    c.store.remove("nodes", "spot-2")
    h.reconcile()
    assert surge_copy(c, "web")["spec"]["replicas"] == 1


# A Deployment's name may have 253 characters; a label value 63 (the copy's surge-of label
# and its selector), an object name 253 (the copy's name: the prefix and the Deployment's).
LONG = "checkout-" + "x" * 91  # 100: over a label value's limit
LONGEST = "payments-" + "y" * 231  # 240: the copy's name would be over 253


@pytest.mark.parametrize("name", [LONG, LONGEST], ids=["100", "240"])
def test_a_deployment_with_a_long_name_is_surged_by_a_copy_its_functions_recognize(name: str) -> None:
    """Before, the copy's label carried the whole name: the API refused the copy (422: a label
    value is at most 63 characters) and the surge was lost at every retry; a name over 237
    characters was cut for the copy's name but compared uncut by the readers (its pods not
    counted as the Deployment's, its copy taken for a left-over)."""
    dep = sc.deployment(name, 2)
    dep["spec"]["selector"] = {"matchLabels": {"app": "long"}}
    dep["spec"]["template"]["metadata"]["labels"] = {"app": "long"}
    rs_name = f"{name}-5d4f8"  # the Deployment controller's: <deployment>-<pod-template-hash>
    pods = []
    for i, node in enumerate(("od-0", "spot-0")):
        p = pod(dep, i, node)
        p["metadata"]["name"] = f"{rs_name}-"[:248] + f"{i:05d}"  # generateName's base is cut to 248
        p["metadata"]["labels"] = {"app": "long", "pod-template-hash": "5d4f8"}
        p["metadata"]["ownerReferences"][0]["name"] = rs_name
        pods.append(p)
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": "d", "controller": True}
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": rs_name,
            "namespace": "shop",
            "labels": {"app": "long", "pod-template-hash": "5d4f8"},
            "ownerReferences": [ref],
        },
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "long"}}, "template": dep["spec"]["template"]},
    }
    objs = [sc.namespace("shop"), sc.namespace("spotguard"), sc.node("od-0", "on-demand"), sc.node("spot-0", "spot")]
    with testing.running_cluster([*objs, dep, rs, *pods], controllers=False) as sim:
        c = Cluster(sim)
        owners = {("shop", rs_name): name}
        h = c.handler(config=copy_mode())
        assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
        copy = surge_copy(c, name)
        assert copy is not None, [r["metadata"]["name"] for r in c.store.list("replicasets", namespace="shop")[0]]
        assert len(copy["metadata"]["name"]) <= 253 and copy["spec"]["replicas"] == 1
        assert len(copy["metadata"]["labels"][SURGE_OF]) <= 63
        assert surge_record(c.store, name)["nodes"] == ["spot-0"]
        # The temporary budget too (its name as the copy's: the API refused it over 253).
        budgets = [b["metadata"]["name"] for b in c.store.list("poddisruptionbudgets", namespace="shop")[0]]
        assert budgets == [copy["metadata"]["name"]], budgets
        # The copy's pod is the Deployment's replica for every function.
        made = {
            "metadata": {
                "name": "copy-pod",
                "namespace": "shop",
                "labels": dict(copy["spec"]["template"]["metadata"]["labels"]),
                "annotations": dict(copy["spec"]["template"]["metadata"]["annotations"]),
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": copy["metadata"]["name"],
                     "uid": copy["metadata"]["uid"], "controller": True}
                ],
            },
            "spec": {"nodeName": "od-0", "containers": [{"name": "c", "image": "pause"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        c.store.create("pods", made, namespace="shop")
        view = pod_views.PodView.from_json(c.store.get("pods", "copy-pod", "shop"))
        assert interruption.copy_workload_key(view) == f"Deployment/shop/{name}"
        assert interruption.workload_key_of(view, owners) is None
        # The reconcile finds the copy as the Deployment's (not a left-over to sweep) and keeps it.
        h.reconcile()
        assert surge_copy(c, name) is not None and surge_record(c.store, name)["nodes"] == ["spot-0"]


def pinned_on_demand_or_none(rs: Obj) -> bool:
    affinity = rs["spec"]["template"]["spec"].get("affinity") or {}
    return patches.REQUIRED in (affinity.get("nodeAffinity") or {}) and pinned_on_demand(rs)


def test_a_copy_deleted_since_the_read_is_made_again_with_the_new_notice(cluster: Cluster) -> None:
    """spot-1's warning is planned on a read that still lists web's copy, deleted since (a
    surge's end in another pass, or a person): its replace answers NotFound. The surge is not
    dropped as if the Deployment were gone: the copy is made again, on the ledger's record
    and the new notice."""
    c = cluster
    h = c.handler()
    assert h.handle([c.notice("spot-0")]) == [Outcome.DONE]
    snapshot = h.snapshot()
    c.store.remove("replicasets", surge_copy_name("web"), "shop")
    h.snapshot = lambda **_: snapshot  # type: ignore[method-assign]
    assert h.handle([c.notice("spot-1")]) == [Outcome.DONE]
    web = c.record("web")
    assert web is not None and web["nodes"] == ["spot-0", "spot-1"], web
    assert surge_copy(c, "web")["spec"]["replicas"] == 2
