"""Issue 24 (work in progress): the surge as a spotguard-owned copy of the Deployment
(the ``surge_copy`` setting), beside the workload's other writers, end to end through
the served function on the simulated cluster (20x time, pods Ready in 10 s).

The writers as they behave: ``kubectl replace`` (as Argo CD ``Replace=true`` and
``helm upgrade --force`` do: the manifest as in Git, spotguard's annotations gone) once
during the notice window; Argo CD self-heal with ``Replace=true`` replacing the
manifest every simulated second; Flux's server-side apply at its interval (30 s here:
the fields it manages, ``spec.replicas`` among them, put back; other annotations
kept); an HPA on web at its 15 s sync period (a steady load that needs 6). The
promise: the Deployment serves its pre-notice count throughout (its own pods and the
copy's, which sit behind its Services), and afterwards nothing of spotguard's is left.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from spotguard.policy import config, surgecopy
from spotguard.policy.workloads import PLACEMENT_LABEL, SURGE_OF, SURGE_REPLICA, surge_copy_name
from spotguard_sim import readiness

from tests.interruption import e2e_harness as h
from tests.interruption.test_e2e_drainer import pods_on
from tests.interruption.test_e2e_owners import reconcile, record, running, warning

KEY = "Deployment/shop/web"


def copy_mode(sim: Any, **kw: Any) -> Any:
    cfg = kw.pop("config", config.Config())
    return h.handler_for(sim, config=dataclasses.replace(cfg, surge_copy=True), **kw)


def manifest(store: Any) -> dict[str, Any]:
    """The Deployment as in Git: its spec, no annotation of spotguard's."""
    d = store.get("deployments", "web", "shop")
    return {"spec": copy.deepcopy(d["spec"]), "labels": dict(d["metadata"].get("labels") or {})}


def apply(store: Any, git: dict[str, Any]) -> None:
    """Flux's server-side apply: the fields in the manifest as in Git, the rest kept."""
    store.mutate("deployments", "web", "shop", lambda d: d["spec"].update(replicas=git["spec"]["replicas"]))


def replace(store: Any, git: dict[str, Any]) -> None:
    """``kubectl replace -f web.yaml``: spec and metadata as in the file, nothing else kept."""

    def put(d: dict[str, Any]) -> None:
        d["spec"] = copy.deepcopy(git["spec"])
        d["metadata"]["annotations"] = {}
        d["metadata"]["labels"] = dict(git["labels"])

    store.mutate("deployments", "web", "shop", put)


def copy_of_web(store: Any) -> dict[str, Any] | None:
    items = store.list("replicasets", namespace="shop")[0]
    return next((rs for rs in items if rs["metadata"]["name"] == surge_copy_name("web")), None)


def watching(store: Any, doomed: list[str]) -> h.Watcher:
    """The serving count of every workload, its lows recorded from now."""
    watcher = h.Watcher()
    watcher.start(store)
    watcher.arm(doomed)
    return watcher


def test_the_trackers_labels_are_the_copys() -> None:
    assert (readiness.SURGE_OF, readiness.SURGE_COPY_PREFIX) == (SURGE_OF, surgecopy.PREFIX)


@pytest.mark.parametrize("writer", ["kubectl-replace", "argocd-replace-self-heal", "flux-apply", "hpa"])
def test_the_copy_keeps_the_pre_notice_count_whoever_writes_the_deployment(writer: str) -> None:
    with running(hpa=writer == "hpa", make=copy_mode) as (sim, handler, spot):
        store = sim.store
        git = manifest(store)
        watcher = watching(store, spot)
        before = watcher.count(KEY)
        assert before == 6
        t0 = sim.clock.now()
        warning(handler, sim, spot)
        assert record(store) is not None and store.get("deployments", "web", "shop")["spec"]["replicas"] == 6
        rs = copy_of_web(store)
        assert rs is not None and rs["spec"]["replicas"] >= 1
        sim.reclaim(spot, after_seconds=120)
        replaced = {"at": -1.0}

        def write() -> None:
            now = sim.clock.now()
            once = writer == "kubectl-replace" and replaced["at"] < 0 and now >= t0 + 12
            again = writer == "argocd-replace-self-heal" and now >= replaced["at"] + 1
            if once or again:
                replace(store, git)
                replaced["at"] = now
            elif writer == "flux-apply" and now >= replaced["at"] + 30:
                apply(store, git)
                replaced["at"] = now

        def over() -> bool:
            write()
            reconcile(handler)
            gone = not {n["metadata"]["name"] for n in store.list("nodes")[0]} & set(spot)
            return gone and copy_of_web(store) is None and record(store) is None

        h.wait_until(over, 90, "the reclaim, the Deployment's own replacements and the copy's removal", step=0.2)
        assert watcher.lowest[KEY] >= before, (writer, watcher.lowest[KEY])
        assert store.get("deployments", "web", "shop")["spec"]["replicas"] == 6
        if writer == "hpa":  # never raised: nothing to put back
            assert store.get("horizontalpodautoscalers", "web", "shop")["spec"]["minReplicas"] == 6
        h.wait_until(lambda: watcher.count(KEY) == 6, 30, "six serving, all the Deployment's own")


def test_spotguard_drains_once_the_copy_serves_for_the_doomed_pods() -> None:
    """spotguard as the drainer (drain: true) counts the copy's Ready pods as the
    Deployment's: the doomed pods go before the reclaim, the Deployment's own
    replacements follow, and the copy goes once they are Ready."""
    drain = dataclasses.replace(config.Config(), drain=True)
    with running(make=lambda sim, **kw: copy_mode(sim, config=drain, **kw)) as (sim, handler, spot):
        store = sim.store
        watcher = watching(store, spot)
        warning(handler, sim, spot)
        sim.reclaim(spot, after_seconds=120)
        h.wait_until(
            lambda: (reconcile(handler), pods_on(store, spot) == 0)[1], 60, "spotguard to empty the doomed nodes", 0.2
        )
        assert {n["metadata"]["name"] for n in store.list("nodes")[0]} >= set(spot)  # before the reclaim

        def over() -> bool:
            reconcile(handler)
            return copy_of_web(store) is None and record(store) is None

        h.wait_until(over, 90, "the copy's removal", step=0.2)
        assert watcher.lowest[KEY] >= 6, watcher.lowest[KEY]


def test_the_deployments_own_replacements_are_placed_by_its_usual_floor_while_a_copy_surges(
    tmp_path: Any,
) -> None:
    """GIVEN web (6, floor 1, some pods on on-demand already) placed by the shipped
    webhook, and a copy surge for one spot node, WHEN a drainer deletes web's pods on that
    node, THEN the Deployment's replacements are decided by its usual floor (met: spot
    preferred, no surge replica), not by a floor raised by the record's ``surge``: the
    copy's own pods are the surge's on-demand replicas, pinned by its template."""
    with running(make=copy_mode) as (sim, handler, spot), h.admission_webhook(sim, tmp_path):
        store = sim.store
        doomed = spot[0]
        warning(handler, sim, [doomed])
        rec = record(store)
        assert rec is not None and rec["surge"] >= 1 and rec.get("copy") is True
        h.wait_until(lambda: (reconcile(handler), copy_ready(store))[1], 30, "the copy's pods Ready")
        old = {p["metadata"]["uid"] for p in store.list("pods", "shop")[0]}
        for p in store.list("pods", "shop")[0]:
            if p["spec"].get("nodeName") == doomed and SURGE_OF not in p["metadata"]["labels"]:
                store.delete("pods", p["metadata"]["name"], "shop")

        def replacements() -> list[dict[str, Any]]:
            return [
                p
                for p in store.list("pods", "shop")[0]
                if p["metadata"]["uid"] not in old and SURGE_OF not in p["metadata"]["labels"]
            ]

        h.wait_until(lambda: len(replacements()) >= rec["surge"], 30, "the Deployment's own replacements")
        placed = [
            (p["metadata"]["labels"].get(PLACEMENT_LABEL), p["metadata"].get("annotations", {}).get(SURGE_REPLICA))
            for p in replacements()
        ]
        assert placed and all(where == "spot" and surge is None for where, surge in placed), placed


def copy_ready(store: Any) -> bool:
    rs = copy_of_web(store)
    if rs is None:
        return False
    pods = [p for p in store.list("pods", "shop")[0] if SURGE_OF in p["metadata"]["labels"]]
    return len(pods) == rs["spec"]["replicas"] and all(readiness.is_ready(p) for p in pods)


def test_node_added_leaves_a_deployment_its_copy_serves_alone_though_a_replace_took_its_record() -> None:
    """GIVEN a copy surge for one spot node of web (6, some pods on on-demand above its
    floor of 1, room on the other spot node), WHEN ``kubectl replace`` puts the manifest back
    (the record is the copy's: nothing of the surge's is on the Deployment to take) and
    node-added passes in copy mode, THEN node-added reads the copy with its snapshot and
    leaves web to the surge: no move to spot, no repair, the copy kept; its pass skips web as
    a surge in progress."""
    from spotguard.gateway import kube
    from spotguard.nodeadded import reconciler
    from spotguard.policy.rebalance import SkipReason

    with running(make=copy_mode) as (sim, handler, spot):
        store = sim.store
        git = manifest(store)
        warning(handler, sim, [spot[0]])
        h.wait_until(lambda: (reconcile(handler), copy_ready(store))[1], 30, "the copy's pods Ready")
        replace(store, git)
        annotations = store.get("deployments", "web", "shop")["metadata"].get("annotations") or {}
        assert "spotguard.io/surge" not in annotations
        assert record(store) is not None  # on the copy
        sim.clock.sleep(40)  # past node-added's settle time for web's newest pod
        cfg = dataclasses.replace(config.Config(), surge_copy=True)
        node_added = reconciler.Reconciler(kube.Kube(sim.api_client()), cfg, clock=sim.clock.now)
        report = node_added.reconcile()
        skipped = {s.workload.key: s.reason for s in report.plan.skipped}
        assert not [m for m in report.plan.moves + report.plan.repairs if m.workload.key == KEY], report.plan
        assert skipped.get(KEY) is SkipReason.SURGE_IN_PROGRESS, skipped
        assert not report.started
        web = store.get("deployments", "web", "shop")
        assert web["spec"]["replicas"] == 6 and "spotguard.io/rebalance" not in web["metadata"].get("annotations", {})
        assert copy_of_web(store) is not None
