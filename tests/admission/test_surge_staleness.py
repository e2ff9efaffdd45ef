"""A workload changed while the admission still holds it in its cache.

The webhook (one real ``spotguard serve admission`` process, default cache
windows: the workload is cached for 2 s) has just admitted a workload's pods,
so its cached copy is warm; the workload is then surged or scaled at once, as
the spot-interruption handler does (one patch: ``spec.replicas`` and the
``spotguard.io/surge`` record). The new pods must be decided on the new floor,
not on the cached one.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from spotguard.admission import core
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy.config import Config
from spotguard_sim import testing

from tests.admission import cluster, servers
from tests.admission.fakekube import FakeKube
from tests.admission.test_e2e import NS, SCENARIO, deployment, statefulset, wait_for, webhook_configuration

PLACEMENT = "spotguard.io/placement"
WINDOW = 1.5  # seconds: the change must land well inside the 2 s workload cache


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.Kube]:
    workdir = tmp_path_factory.mktemp("admission-staleness")
    tls = servers.make_certs(workdir / "tls")
    with (
        testing.running_cluster(SCENARIO, termination_seconds=0.2) as sim,
        contextlib.ExitStack() as stack,
    ):
        env = {"SPOTGUARD_NAMESPACE": "spotguard"}  # default cache windows and trust window
        server = stack.enter_context(servers.running(tls, workdir, kubeconfig=sim.kubeconfig, workers=1, env=env))
        client = kube.Kube(sim.api_client())
        client.create(r.MUTATINGWEBHOOKCONFIGURATIONS, webhook_configuration(server.url + "/mutate", tls.ca_cert))
        yield client


def placements(k: kube.Kube, app: str, total: int) -> dict[str, int]:
    """Placement label -> pods, once ``total`` live pods all carry one."""

    def admitted() -> bool:
        pods = live_pods_of(k, app)
        return len(pods) == total and all(PLACEMENT in (p["metadata"].get("labels") or {}) for p in pods)

    wait_for(admitted, timeout=20, what=f"{total} admitted pods of {app}")
    out: dict[str, int] = {}
    for p in live_pods_of(k, app):
        label = p["metadata"]["labels"][PLACEMENT]
        out[label] = out.get(label, 0) + 1
    return out


def live_pods_of(k: kube.Kube, app: str) -> list[dict[str, Any]]:
    return [
        p
        for p in k.list(r.PODS, NS, label_selector=f"app={app}")
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def inside_window(base: str, setup: Callable[[str], float | None], tries: int = 5) -> str:
    """Run ``setup(name)`` (admit a workload's pods, then change it) until it lands inside
    the cache window (from its start, or from the time ``setup`` returns); the name it
    landed with. On a loaded machine a try may take longer than the window (it would prove
    nothing): a new workload tries again."""
    for attempt in range(tries):
        name = base if attempt == 0 else f"{base}-{attempt}"
        started = time.monotonic()
        started = setup(name) or started
        if time.monotonic() - started < WINDOW:
            return name
    raise AssertionError(f"{tries} tries, none inside the cache window: the test proves nothing")


def surge_record(replicas: int, surge: int) -> str:
    # The shape the interruption handler writes (docs/interruption-handling.md).
    return json.dumps(
        {"replicas": replicas, "surge": surge, "events": ["itn-test"], "nodes": ["spot-0"], "started": time.time()}
    )


def test_surge_pods_right_after_admission_go_on_demand(k: kube.Kube) -> None:
    def setup(name: str) -> None:
        k.create(r.DEPLOYMENTS, deployment(name, 4), NS)
        assert placements(k, name, 4) == {"on-demand": 1, "spot": 3}
        # The interruption handler's surge: one patch, replicas and the record together.
        k.patch(
            r.DEPLOYMENTS,
            name,
            {"metadata": {"annotations": {"spotguard.io/surge": surge_record(4, 3)}}, "spec": {"replicas": 7}},
            NS,
        )

    name = inside_window("surged", setup)
    # floor 1 + surge 3: the three surge pods are on-demand.
    assert placements(k, name, 7) == {"on-demand": 4, "spot": 3}


def test_a_second_surge_right_after_the_first_goes_on_demand_too(k: kube.Kube) -> None:
    def setup(name: str) -> float:
        k.create(r.DEPLOYMENTS, deployment(name, 4), NS)
        assert placements(k, name, 4) == {"on-demand": 1, "spot": 3}
        started = time.monotonic()
        k.patch(
            r.DEPLOYMENTS,
            name,
            {"metadata": {"annotations": {"spotguard.io/surge": surge_record(4, 2)}}, "spec": {"replicas": 6}},
            NS,
        )
        assert placements(k, name, 6) == {"on-demand": 3, "spot": 3}
        if time.monotonic() - started >= WINDOW:
            return started  # too slow: the second surge below would not be inside the window either
        k.patch(
            r.DEPLOYMENTS,
            name,
            {"metadata": {"annotations": {"spotguard.io/surge": surge_record(4, 4)}}, "spec": {"replicas": 8}},
            NS,
        )
        return started

    name = inside_window("surged-twice", setup)
    assert placements(k, name, 8) == {"on-demand": 5, "spot": 3}


def test_a_percentage_floor_follows_a_scale_right_after_admission(k: kube.Kube) -> None:
    def setup(name: str) -> None:
        k.create(r.DEPLOYMENTS, deployment(name, 4, {"spotguard.io/min-on-demand": "50%"}), NS)
        assert placements(k, name, 4) == {"on-demand": 2, "spot": 2}
        k.patch(r.DEPLOYMENTS, name, {"spec": {"replicas": 10}}, NS)

    name = inside_window("pct", setup)
    assert placements(k, name, 10) == {"on-demand": 5, "spot": 5}


def test_a_statefulset_scaled_right_after_admission_places_by_the_new_floor(k: kube.Kube) -> None:
    def setup(name: str) -> None:
        k.create(r.STATEFULSETS, statefulset(name, 3), NS)
        assert placements(k, name, 3) == {"on-demand": 2, "spot": 1}
        k.patch(r.STATEFULSETS, name, {"spec": {"replicas": 7}}, NS)

    name = inside_window("quorum", setup)
    # 7 replicas: floor 7 // 2 + 1 = 4. Ordinal 2 was admitted on spot under the old floor
    # (2 of 3) and stays there; decided by the pods actually placed, ordinals 3 and 4 fill the
    # two missing slots: exactly 4 of 7 on on-demand (issue 8).
    placements(k, name, 7)
    on_demand = {
        int(p["metadata"]["name"].rsplit("-", 1)[1])
        for p in live_pods_of(k, name)
        if p["metadata"]["labels"][PLACEMENT] == "on-demand"
    }
    assert on_demand == {0, 1, 3, 4}


# -- the rule's API cost, on the core with the in-memory gateway ---------------------------


def _surge_in_store(fk: FakeKube, name: str, replicas: int, surge: int, original: int) -> None:
    dep = fk.objects[("deployments", "shop", name)]
    dep["spec"]["replicas"] = replicas
    dep["metadata"].setdefault("annotations", {})["spotguard.io/surge"] = surge_record(original, surge)


def test_a_surge_inside_the_cache_window_costs_one_read_of_the_deployment() -> None:
    fk = FakeKube()
    cluster.basic_cluster(fk)
    _, rs = cluster.deployment(fk, "web", 4)
    ctx = core.Context(Config(), fk, "spotguard")
    for _ in range(4):
        cluster.admit_and_create(ctx, fk, cluster.pod_for(rs))
    assert cluster.placements(fk) == {"on-demand": 1, "spot": 3}
    _surge_in_store(fk, "web", 7, 3, 4)
    fk.stats.reset()
    for _ in range(3):
        cluster.admit_and_create(ctx, fk, cluster.pod_for(rs))
    assert cluster.placements(fk) == {"on-demand": 4, "spot": 3}
    assert fk.stats.count("get", r.DEPLOYMENTS.name) == 1  # read once, then cached again
    assert fk.stats.count("list", r.PODS.name) == 0  # the count is still trusted


def test_replacements_of_deleted_pods_do_not_read_the_deployment_for_every_pod() -> None:
    fk = FakeKube()
    cluster.basic_cluster(fk)
    _, rs = cluster.deployment(fk, "web", 6)
    ctx = core.Context(Config(), fk, "spotguard")
    for _ in range(6):
        cluster.admit_and_create(ctx, fk, cluster.pod_for(rs))
    spot = [p for p in fk.all(r.PODS, "shop") if p["metadata"]["labels"][PLACEMENT] == "spot"]
    for p in spot[:3]:  # three spot pods deleted (a reclaimed node): the ReplicaSet replaces them
        del fk.objects[("pods", "shop", p["metadata"]["name"])]
    fk.stats.reset()
    for _ in range(3):
        cluster.admit_and_create(ctx, fk, cluster.pod_for(rs))
    assert cluster.placements(fk) == {"on-demand": 1, "spot": 5}
    # The first replacement looks like a scale (6 known pods + 1 > 6): one read, which
    # shows no scale, and one recount (which shows the deleted pods gone and would
    # drop reservations proven dead) hold the rule off; the others cost nothing.
    assert fk.stats.count("get", r.DEPLOYMENTS.name) == 1
    assert fk.stats.count("list", r.PODS.name) == 1


def test_pods_that_are_never_created_cost_a_read_per_hold_not_per_pod() -> None:
    # Reviews for pods past the replicas that never get stored (another webhook or a
    # quota refuses them; the benchmark's latency phase): each looks like a scale.
    fk = FakeKube()
    cluster.basic_cluster(fk)
    _, rs = cluster.deployment(fk, "web", 3)
    ctx = core.Context(Config(), fk, "spotguard")
    ctx.reservations.stale_hold = 1.0
    for _ in range(3):
        cluster.admit_and_create(ctx, fk, cluster.pod_for(rs))
    fk.stats.reset()
    started = time.monotonic()
    for _ in range(50):
        answer = core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
        assert cluster.patch_of(answer)
    assert time.monotonic() - started < 1.0
    time.sleep(1.05 - (time.monotonic() - started))
    for _ in range(50):
        core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
    assert fk.stats.count("get", r.DEPLOYMENTS.name) == 2  # once per hold
    assert fk.stats.count("list", r.PODS.name) == 2  # and one recount per hold
