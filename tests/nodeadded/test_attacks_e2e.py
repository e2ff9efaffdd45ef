"""The reconcile as users' clusters treat it: a pass cut off half-way, two reconcilers at once,
GitOps putting the replica count back in the middle of a move.

Each starts from a Deployment that spilled to on-demand while spot was full (4 replicas, floor 1),
with the served admission webhook placing every pod.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config, moves

from tests.nodeadded import harness as h

TIME_SCALE = 20.0
# One pod a move: each attack below is about one move at a time (batches: test_launch_e2e.py)
CFG = config.Config(
    rebalance_move_timeout_seconds=200,
    rebalance_hold_seconds=100,
    rebalance_settle_seconds=0,
    rebalance_max_pods_per_workload=1,
)
KEY = "Deployment/shop/web"


@pytest.fixture
def spilled(tmp_path: Any) -> Iterator[Any]:
    with h.spilled_cluster(tmp_path, replicas=4, spot_nodes=2, time_scale=TIME_SCALE) as sim:
        yield sim


def costs(store: Any) -> list[str | None]:
    return [
        (p["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost")
        for p in store.list("pods", "shop")[0]
        if h.live(p)
    ]


def test_a_pass_cut_off_after_the_record_is_finished_by_the_next(spilled: Any) -> None:
    sim = spilled
    watcher = h.Watcher()
    watcher.start(sim.store)
    watcher.arm([])
    rec = h.reconciler_for(sim, CFG)
    rule = sim.faults.set(verb="patch", resource="pods", error_rate=1.0, status=500)

    def recorded() -> bool:
        # A pass may lose the race for the Deployment to its controller (409): the next one starts.
        rep = rec.reconcile()
        web = sim.store.get("deployments", "web", "shop")
        return moves.MOVE in (web["metadata"].get("annotations") or {}) and rep.failures == 1

    h.wait_until(recorded, 30, "a pass that wrote the record and failed to rank the pod", step=0.2)
    web = sim.store.get("deployments", "web", "shop")
    # the record written (the lock), the ranking not: the "+1" follows the ranking, so the count is the owner's
    assert web["spec"]["replicas"] == 4
    assert str(moves.FIRST_TO_GO) not in costs(sim.store)
    sim.faults.clear()
    assert rule
    h.passes_until(rec, lambda rep: not rep.progress and h.at_optimum(sim.store, [KEY]), max_passes=80)
    assert h.placement(sim.store)[KEY] == (1, 3, 0)
    assert watcher.lowest[KEY] >= 4
    assert str(moves.FIRST_TO_GO) not in costs(sim.store)  # nothing left ranked first


def test_two_reconcilers_at_once_never_move_one_workload_twice(spilled: Any) -> None:
    # (Once an expected failure: web left at 5, its move's "+1" behind. The cause: a pass whose
    # pod list was read before the ReplicaSet removed the pod a finished move ranked first to
    # go, and whose Deployment read came after the finish, saw that pod as on-demand surplus
    # and moved it again; the test then stopped both reconcilers mid-move. A workload with
    # more pods than replicas is now left alone: spotguard.policy.rebalance "pods-leaving".)
    sim = spilled
    highest = {"replicas": 0}
    lock = threading.Lock()
    # web's count and move record at every write: what a failure here is to be read from
    history: list[tuple[int, str | None]] = []

    def annotations() -> dict[str, str]:
        return sim.store.get("deployments", "web", "shop")["metadata"].get("annotations") or {}

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "deployments" and obj["metadata"]["name"] == "web":
            with lock:
                highest["replicas"] = max(highest["replicas"], obj["spec"]["replicas"])
                step = (obj["spec"]["replicas"], (obj["metadata"].get("annotations") or {}).get(moves.MOVE))
                if not history or history[-1] != step:
                    history.append(step)

    sim.store.subscribe(watch)
    watcher = h.Watcher()
    watcher.start(sim.store)
    watcher.arm([])
    recs = [h.reconciler_for(sim, CFG), h.reconciler_for(sim, CFG)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(rec: Any) -> None:
        try:
            while not stop.is_set():
                rec.reconcile()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rec,)) for rec in recs]
    for t in threads:
        t.start()
    try:
        try:
            h.wait_until(
                lambda: h.at_optimum(sim.store, [KEY]) and moves.MOVE not in annotations(),
                90,
                "web at its optimum",
                step=0.2,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; web's count and move record at each write: {history}") from exc
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors
    assert highest["replicas"] == 5, history  # one move at a time: never 4 + 2
    assert watcher.lowest[KEY] >= 4
    told = "\n".join(f"{n} {(r or '')[-170:]}" for n, r in history)
    assert h.floors_of(sim.store)[KEY] == (4, 1), told


def test_gitops_puts_the_count_back_during_a_move_theirs_wins(spilled: Any) -> None:
    sim = spilled
    k = kube.Kube(sim.api_client())
    rec = h.reconciler_for(sim, CFG)
    started: list[Any] = []

    def a_move_started() -> bool:
        # A pass may lose the race for the Deployment to its controller (409): the next one starts.
        started.extend(rec.reconcile().started)
        return bool(started)

    h.wait_until(a_move_started, 30, "a move started", step=0.2)
    [move] = started
    assert sim.store.get("deployments", "web", "shop")["spec"]["replicas"] == 5
    k.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 4}}, "shop")  # Argo CD self-heal
    h.wait_until(lambda: len([p for p in sim.store.list("pods", "shop")[0] if h.live(p)]) == 4, 30, "4 pods")
    second = rec.reconcile()
    [step] = second.progress
    assert step.action is moves.Action.HOLD
    web = sim.store.get("deployments", "web", "shop")
    assert web["spec"]["replicas"] == 4  # the owner's count stays
    record = moves.MoveRecord.parse(web["metadata"]["annotations"][moves.MOVE])
    assert record is not None and record.held
    # The pod ranked first by the move (if the scale-down spared it) has its cost back.
    pods = {p["metadata"]["uid"]: p for p in sim.store.list("pods", "shop")[0] if h.live(p)}
    if move.pod.uid in pods:
        annotations = pods[move.pod.uid]["metadata"].get("annotations") or {}
        assert annotations.get("controller.kubernetes.io/pod-deletion-cost") != str(moves.FIRST_TO_GO)
    # Held: passes write nothing until the hold ends.
    writes = rec.kube.stats.writes
    rec.reconcile()
    assert rec.kube.stats.writes == writes
