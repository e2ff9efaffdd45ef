"""The admission core against an in-memory gateway: decisions, reservations, failure modes."""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import time
from typing import Any

import pytest
from spotguard.admission import core, deadline, errors, metrics
from spotguard.admission.reservations import ANNOTATION, POD_ANNOTATION, lease_name
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import moves
from spotguard.policy.config import Config
from spotguard.policy.workloads import MOVE_REQUIRES_SPOT

from tests.admission import cluster
from tests.admission.fakekube import FakeKube


@pytest.fixture
def k() -> FakeKube:
    fake = FakeKube()
    cluster.basic_cluster(fake)
    return fake


# In-process there is no webhook timeout to stay inside, and a loaded test machine can starve a
# thread for seconds: the review deadline is generous here (tests/admission/test_deadline.py and
# the end-to-end tests hold the real one).
REVIEW_SECONDS = 30.0


def make_ctx(k: FakeKube, trust: float = 3.0, **config: object) -> core.Context:
    return core.Context(
        dataclasses.replace(Config(), **config),  # type: ignore[arg-type]
        k,
        "spotguard",
        trust_seconds=trust,
        review_seconds=REVIEW_SECONDS,
    )


# -- decoding --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], errors.WrongType),
        (
            {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}},
            errors.WrongType,
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, errors.WrongType),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, errors.MissingRequest),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}},
            errors.MissingRequest,
        ),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}},
            errors.MissingRequest,
        ),
    ],
)
def test_a_request_that_is_not_an_admission_review_is_a_webhook_error(k: FakeKube, body: object, error: type) -> None:
    with pytest.raises(error):
        core.serve(body, make_ctx(k))


def test_a_pod_create_without_an_object_is_a_webhook_error(k: FakeKube) -> None:
    rev = cluster.review({}, "shop")
    del rev["request"]["object"]
    with pytest.raises(errors.MissingObject):
        core.serve(rev, make_ctx(k))


def test_build_response_echoes_the_uid_and_encodes_the_patch() -> None:
    answer = core.build_response(uid="u-1", patch=[{"op": "add", "path": "/a", "value": 1}], warnings=["w"])
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["response"]["uid"] == "u-1"
    assert answer["response"]["allowed"] is True
    assert cluster.patch_of(dict(answer)) == [{"op": "add", "path": "/a", "value": 1}]
    assert "patch" not in core.build_response(uid="u-2")["response"]


@pytest.mark.parametrize(
    ("resource", "operation"),
    [
        ({"group": "apps", "version": "v1", "resource": "deployments"}, "CREATE"),
        ({"group": "", "version": "v1", "resource": "pods"}, "UPDATE"),
    ],
)
def test_other_resources_and_operations_are_allowed_without_a_patch(
    k: FakeKube, resource: dict, operation: str
) -> None:
    _, rs = cluster.deployment(k, "web", 2)
    rev = cluster.review(cluster.pod_for(rs), "shop", operation=operation)
    rev["request"]["resource"] = resource
    answer = core.serve(rev, make_ctx(k))
    assert cluster.patch_of(answer) == []
    assert k.stats.requests == 0


# -- floors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "annotations", "floor"),
    [
        (1, {}, 1),
        (2, {}, 1),
        (10, {}, 1),
        (10, {"spotguard.io/min-on-demand": "3"}, 3),
        (10, {"spotguard.io/min-on-demand": "25%"}, 3),
        (4, {"spotguard.io/min-on-demand": "0"}, 0),
    ],
)
def test_a_deployment_gets_exactly_its_floor_on_demand(
    k: FakeKube, replicas: int, annotations: dict, floor: int
) -> None:
    _, rs = cluster.deployment(k, "web", replicas, annotations=annotations)
    ctx = make_ctx(k)
    for _ in range(replicas):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert cluster.placements(k) == {k2: v for k2, v in {"on-demand": floor, "spot": replicas - floor}.items() if v}


@pytest.mark.parametrize(("replicas", "floor"), [(1, 1), (3, 2), (7, 4)])
def test_a_statefulset_decides_by_ordinal(k: FakeKube, replicas: int, floor: int) -> None:
    sts = cluster.statefulset(k, "db", replicas)
    ctx = make_ctx(k)
    for i in range(replicas):
        _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(sts, ordinal=i))
        expected = "on-demand" if i < floor else "spot"
        assert pod["metadata"]["labels"]["spotguard.io/placement"] == expected
    assert k.stats.count(resource="leases.coordination.k8s.io") == 0  # no reservation for ordinals


def test_the_on_demand_pod_gets_required_affinity_and_the_spot_pod_a_preference(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 2)
    ctx = make_ctx(k)
    _, first = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    _, second = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    required = first["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": cluster.CAPACITY, "operator": "NotIn", "values": ["spot"]} in (
        required["nodeSelectorTerms"][0]["matchExpressions"]
    )
    assert first["metadata"]["annotations"][POD_ANNOTATION]
    preferred = second["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": cluster.CAPACITY, "operator": "In", "values": ["spot"]} in [
        p["preference"]["matchExpressions"][0] for p in preferred
    ]
    assert {c["topologyKey"] for c in second["spec"]["topologySpreadConstraints"]} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }


def test_spot_nodes_that_join_after_a_reclaim_get_spot_slots_at_once_not_after_the_node_cache_minute() -> None:
    # GIVEN a cluster whose spot nodes are all gone (only on-demand nodes), and a warm webhook
    # that placed the workload's pods there (on-demand is all their spec could reach)
    k = FakeKube()
    cluster.basic_cluster(k, spot_nodes=0)
    _, rs = cluster.deployment(k, "web", 4)
    ctx = make_ctx(k)
    now = [time.monotonic()]
    ctx.resolver.clock = lambda: now[0]  # the node list's age (the reservations keep their own clock)
    for _ in range(3):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert cluster.placements(k) == {"on-demand": 3}
    lists = k.stats.count(verb="list", resource="nodes")
    assert lists == 1  # while no spot node exists, not a node list per pod
    # WHEN a spot node joins and, 2 s later, node-added scales the workload up to move a replica
    k.put(r.NODES, {"metadata": {"name": "spot-new", "labels": {cluster.CAPACITY: "spot"}}})
    now[0] += 2
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    # THEN the new pod gets a spot slot (a spot preference), not another forced on-demand one
    assert pod["metadata"]["labels"]["spotguard.io/placement"] == "spot"
    preferred = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": cluster.CAPACITY, "operator": "In", "values": ["spot"]} in [
        p["preference"]["matchExpressions"][0] for p in preferred
    ]


# -- a move back to spot under way -------------------------------------------------------


def _required_spot(pod: dict[str, Any]) -> bool:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return any(e.get("operator") == "In" and "spot" in str(e.get("values")).lower()
               for t in terms for e in t.get("matchExpressions") or [])  # fmt: skip


def test_a_moves_new_replica_requires_spot_and_is_marked_not_one_the_owner_added(k: FakeKube) -> None:
    """While node-added's move to spot is under way (its record on the Deployment: the owner's 4,
    the move's 7) a new replica is the move's: it requires spot, marked with the move. With the
    count above the move's (the owner or an autoscaler grew it during the move) the new replicas
    are theirs: a spot slot's preferences only, no mark, so none waits Pending for a spot launch
    that may never come (chaos spot-refused-after-reclaim under 500s); so are those created
    while an interruption surge is in progress (the move waits for it)."""
    started = 1_800_000_000.0
    record = moves.MoveRecord(moves.Direction.TO_SPOT, moves.Method.SCALE, "web-abc123-x", "u", 4, 7, started, 4)
    annotations = {"spotguard.io/min-on-demand": "0", moves.MOVE: record.to_json()}
    _, moving = cluster.deployment(k, "web", 7, annotations=annotations)
    _, grown = cluster.deployment(k, "api", 8, annotations=annotations)
    surge = {**annotations, "spotguard.io/surge": '{"replicas": 7}'}
    _, surging = cluster.deployment(k, "cart", 7, annotations=surge)
    ctx = make_ctx(k)
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(moving))
    assert pod["metadata"]["labels"]["spotguard.io/placement"] == "spot"
    assert _required_spot(pod)
    assert pod["metadata"]["annotations"][MOVE_REQUIRES_SPOT] == f"{started:.3f}"
    # the owner grew it during the move, or an interruption surge replaces pods going away
    for owner in (grown, surging):
        _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(owner))
        assert pod["metadata"]["labels"]["spotguard.io/placement"] == "spot"
        assert not _required_spot(pod)
        assert MOVE_REQUIRES_SPOT not in (pod["metadata"].get("annotations") or {})


def test_a_copy_surge_in_progress_makes_new_replicas_replacements_not_the_moves(k: FakeKube) -> None:
    """A copy's surge keeps its record on the copy (the Deployment carries none): while one is
    in progress on a Deployment whose move to spot is recorded, the replicas created now replace
    pods going away (a drained pod's replacement): no spot requirement, no mark. Read from the
    Deployment alone, they required spot and waited Pending while EC2 refused it."""
    from spotguard.policy import surgecopy
    from spotguard.policy.surges import SurgeRecord

    started = 1_800_000_000.0
    record = moves.MoveRecord(moves.Direction.TO_SPOT, moves.Method.SCALE, "web-abc123-x", "u", 4, 7, started, 4)
    annotations = {"spotguard.io/min-on-demand": "0", moves.MOVE: record.to_json()}
    dep, moving = cluster.deployment(k, "web", 7, annotations=annotations)
    ctx = make_ctx(k)
    _, before = cluster.admit_and_create(ctx, k, cluster.pod_for(moving))
    assert _required_spot(before)  # no surge yet: the move's replica
    surge = SurgeRecord(replicas=7, surge=1, events=("e",), nodes=("spot-9",), started=started, copy=True)
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    full = {**dep, "kind": "Deployment", "spec": {**dep["spec"], "template": template}}
    body = surgecopy.build(full, 1, Config(), record=surge)
    assert isinstance(body, dict)
    k.put(r.REPLICASETS, body)
    ctx = make_ctx(k)  # (a fresh cache: the copy is read as the workload is, within its lifetime)
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(moving))
    assert pod["metadata"]["labels"]["spotguard.io/placement"] == "spot"
    assert not _required_spot(pod)
    assert MOVE_REQUIRES_SPOT not in (pod["metadata"].get("annotations") or {})


# -- idempotency, dry run, opt-out ------------------------------------------------------


def test_reinvocation_keeps_the_placement_with_an_empty_patch_and_no_api_call(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 3)
    ctx = make_ctx(k)
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    before = k.stats.requests
    again = core.serve(cluster.review(pod, "shop"), ctx)
    assert cluster.patch_of(again) == []
    assert k.stats.requests == before


def test_dry_run_reserves_nothing_and_writes_nothing(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 3)
    ctx = make_ctx(k)
    for _ in range(3):
        _answer, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(rs), dry_run=True)
        assert pod["metadata"]["labels"]["spotguard.io/placement"] == "on-demand"
    assert k.stats.writes == 0
    assert k.all(r.LEASES) == []


def test_a_namespace_or_workload_that_opts_out_is_left_alone(k: FakeKube) -> None:
    k.put(r.NAMESPACES, {"metadata": {"name": "quiet", "annotations": {"spotguard.io/enabled": "false"}}})
    _, rs = cluster.deployment(k, "web", 2, namespace="quiet")
    _, rs2 = cluster.deployment(k, "off", 2, annotations={"spotguard.io/enabled": "false"})
    ctx = make_ctx(k)
    assert cluster.patch_of(cluster.admit_and_create(ctx, k, cluster.pod_for(rs))[0]) == []
    assert cluster.patch_of(cluster.admit_and_create(ctx, k, cluster.pod_for(rs2))[0]) == []


def test_excluded_namespaces_bare_pods_and_daemonset_pods_are_left_alone_without_api_calls(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "dns", 2, namespace="kube-system")
    ds_pod = cluster.pod_for(rs)
    ds_pod["metadata"]["ownerReferences"][0]["kind"] = "DaemonSet"
    bare = cluster.pod_for(rs)
    bare["metadata"].pop("ownerReferences")
    ctx = make_ctx(k)
    for pod in (cluster.pod_for(rs), ds_pod, bare):
        assert cluster.patch_of(core.serve(cluster.review(pod, pod["metadata"]["namespace"]), ctx)) == []
    assert k.stats.requests == 0


def test_an_invalid_annotation_is_one_warning_event_and_the_default_applies(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 4, annotations={"spotguard.io/min-on-demand": "lots"})
    ctx = make_ctx(k)
    for _ in range(4):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert cluster.placements(k) == {"on-demand": 1, "spot": 3}
    assert len(k.events) == 1
    assert k.events[0]["type"] == "Warning"
    assert "lots" in k.events[0]["message"]


# -- failing open ------------------------------------------------------------------------


@pytest.mark.parametrize("error", [kube.Transient, kube.Forbidden, kube.TooManyRequests])
def test_an_unreachable_api_answers_allowed_without_a_patch_and_counts_it(
    k: FakeKube, error: type[kube.ApiError]
) -> None:
    _, rs = cluster.deployment(k, "web", 2)
    k.fail = error
    before = metrics.REQUESTS.labels("failed_open", "none")._value.get()
    answer = core.serve(cluster.review(cluster.pod_for(rs), "shop"), make_ctx(k))
    assert answer["response"]["allowed"] is True
    assert "patch" not in answer["response"]
    assert metrics.REQUESTS.labels("failed_open", "none")._value.get() == before + 1


def test_a_review_that_fails_open_logs_where_its_time_went(k: FakeKube, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a review that arrived 0.4 s before a thread took it, and an API that fails
    _, rs = cluster.deployment(k, "web", 2)
    k.fail = kube.Transient
    with deadline.arrived(time.monotonic() - 0.4, 3.0):
        answer = core.serve(cluster.review(cluster.pod_for(rs), "shop"), make_ctx(k))
    # THEN it is let through, and its log line says how long it waited and how long it decided
    assert "patch" not in answer["response"]
    (line,) = [rec for rec in caplog.records if rec.getMessage() == "admission failed; allowing the pod unchanged"]
    assert 0.4 <= line.waited < 3.0  # type: ignore[attr-defined]
    assert 0.0 <= line.seconds < 3.0  # type: ignore[attr-defined]


def test_no_cluster_connection_fails_open() -> None:
    ctx = core.Context(Config(), None, connect_error="nothing configured")
    pod = cluster.pod_for(
        {"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "shop", "uid": "u"}, "spec": {}}
    )
    answer = core.serve(cluster.review(pod, "shop"), ctx)
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]


# -- reservations ------------------------------------------------------------------------


def _burst(k: FakeKube, rs: dict, contexts: list[core.Context], n: int, threads: int = 12) -> None:
    pods = [cluster.pod_for(rs) for _ in range(n)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = [
            pool.submit(cluster.admit_and_create, contexts[i % len(contexts)], k, pod) for i, pod in enumerate(pods)
        ]
        for f in futures:
            f.result()


@pytest.mark.parametrize(
    ("annotations", "floor"),
    [({}, 1), ({"spotguard.io/min-on-demand": "50%"}, 30), ({"spotguard.io/min-on-demand": "7"}, 7)],
)
def test_three_instances_admitting_60_pods_at_once_hand_out_exactly_the_floor(annotations: dict, floor: int) -> None:
    for _ in range(5):
        k = FakeKube()
        cluster.basic_cluster(k)
        _, rs = cluster.deployment(k, "web", 60, annotations=annotations)
        contexts = [make_ctx(k) for _ in range(3)]  # three processes: separate caches and locks
        _burst(k, rs, contexts, 60)
        assert cluster.placements(k) == {"on-demand": floor, "spot": 60 - floor}


def _numbers(k: FakeKube, base: int) -> dict[str, list[int]]:
    """The replica number each pod's deletion cost stands for, by placement, sorted."""
    out: dict[str, list[int]] = {}
    for p in k.all(r.PODS, "shop"):
        cost = int(p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"])
        out.setdefault(p["metadata"]["labels"]["spotguard.io/placement"], []).append(base - cost)
    return {where: sorted(ns) for where, ns in out.items()}


def test_three_instances_admitting_a_quarter_floor_at_once_number_every_replica_once() -> None:
    """Replica n is on-demand when the floor grows at n (25 %: 1, 5, 9, ...): a scale-down to
    m keeps numbers 1..m, exactly the floor of m on-demand. Instances deciding at once never
    give two pods one number (spot numbers are recorded in the Lease too)."""
    base = Config().on_demand_deletion_cost
    for _ in range(3):
        k = FakeKube()
        cluster.basic_cluster(k)
        _, rs = cluster.deployment(k, "web", 40, annotations={"spotguard.io/min-on-demand": "25%"})
        _burst(k, rs, [make_ctx(k) for _ in range(3)], 40)
        assert _numbers(k, base) == {
            "on-demand": list(range(1, 41, 4)),
            "spot": [n for n in range(1, 41) if n % 4 != 1],
        }


def test_a_count_floor_ranks_its_on_demand_pods_above_one_shared_spot_number(k: FakeKube) -> None:
    base = Config().on_demand_deletion_cost
    _, rs = cluster.deployment(k, "web", 10, annotations={"spotguard.io/min-on-demand": "3"})
    _burst(k, rs, [make_ctx(k) for _ in range(2)], 10)
    assert _numbers(k, base) == {"on-demand": [1, 2, 3], "spot": [4] * 7}


def test_a_replacement_takes_the_replica_number_of_the_pod_it_replaces(k: FakeKube) -> None:
    base = Config().on_demand_deletion_cost
    _, rs = cluster.deployment(k, "web", 8, annotations={"spotguard.io/min-on-demand": "25%"})
    ctx = make_ctx(k, trust=0.0)
    for _ in range(8):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    for number in (5, 6):  # on-demand replica 5 and spot replica 6 go
        gone = next(
            p
            for p in k.all(r.PODS, "shop")
            if p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == str(base - number)
        )
        del k.objects[("pods", "shop", gone["metadata"]["name"])]
    for _ in range(2):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert _numbers(k, base) == {"on-demand": [1, 5], "spot": [2, 3, 4, 6, 7, 8]}


def test_a_pod_refused_after_its_reservation_leaves_the_slot_to_its_retry() -> None:
    # GIVEN an on-demand slot reserved for a pod that a later webhook refused (never stored)
    k = FakeKube()
    cluster.basic_cluster(k)
    _, rs = cluster.deployment(k, "web", 3)
    ctx = make_ctx(k)
    rev = cluster.review(cluster.pod_for(rs), "shop")
    assert "on-demand" in str(core.serve(rev, ctx)["response"]["auditAnnotations"])  # never stored
    # WHEN the ReplicaSet controller retries at once (a few milliseconds later)
    _, retry = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    # THEN the retry waited out the dead reservation's grace and took the slot
    assert retry["metadata"]["labels"]["spotguard.io/placement"] == "on-demand"
    _, third = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert third["metadata"]["labels"]["spotguard.io/placement"] == "spot"
    assert cluster.placements(k) == {"on-demand": 1, "spot": 1}


def test_a_reservation_whose_pod_was_seen_is_removed_once_every_trusted_count_shows_the_pod(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 3)
    ctx = make_ctx(k, trust=0.0)
    cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    cluster.admit_and_create(ctx, k, cluster.pod_for(rs))  # counts, and sees the first pod
    name = lease_name("shop", rs["metadata"]["name"])
    assert '"pending":{"' in k.get(r.LEASES, name, "spotguard")["metadata"]["annotations"][ANNOTATION]
    time.sleep(1.1)  # the trust window (0 s) and the margin (1 s) since the sighting
    cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert '"pending":{}' in k.get(r.LEASES, name, "spotguard")["metadata"]["annotations"][ANNOTATION]
    assert cluster.placements(k) == {"on-demand": 1, "spot": 2}


def test_scale_down_then_up_keeps_the_floor_and_a_lost_on_demand_pod_is_replaced(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 6, annotations={"spotguard.io/min-on-demand": "2"})
    ctx = make_ctx(k, trust=0.0)
    for _ in range(6):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    # Scale down to 3: the ReplicaSet removes spot pods first (pod-deletion-cost).
    spot = [p for p in k.all(r.PODS, "shop") if p["metadata"]["labels"]["spotguard.io/placement"] == "spot"]
    for p in spot[:3]:
        del k.objects[("pods", "shop", p["metadata"]["name"])]
    for _ in range(3):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert cluster.placements(k) == {"on-demand": 2, "spot": 4}
    # An on-demand pod disappears: the next new pod takes its slot.
    gone = next(p for p in k.all(r.PODS, "shop") if p["metadata"]["labels"]["spotguard.io/placement"] == "on-demand")
    del k.objects[("pods", "shop", gone["metadata"]["name"])]
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert pod["metadata"]["labels"]["spotguard.io/placement"] == "on-demand"


def test_a_rollout_gives_the_new_replicaset_its_own_floor(k: FakeKube) -> None:
    _dep, rs_old = cluster.deployment(k, "web", 4)
    ctx = make_ctx(k)
    for _ in range(4):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs_old))
    rs_new = copy.deepcopy(rs_old)
    rs_new["metadata"].update(name="web-def456", uid="new-uid")
    rs_new["spec"]["selector"]["matchLabels"]["pod-template-hash"] = "def456"
    k.put(r.REPLICASETS, rs_new)
    for p in k.all(r.PODS, "shop"):  # the old ReplicaSet is scaled to zero
        del k.objects[("pods", "shop", p["metadata"]["name"])]
    for _ in range(4):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs_new))
    assert cluster.placements(k) == {"on-demand": 1, "spot": 3}


def test_warm_admission_costs_at_most_two_api_requests_per_pod(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 100)
    ctx = make_ctx(k)
    cluster.admit_and_create(ctx, k, cluster.pod_for(rs))  # warm the caches
    k.stats.reset()
    for _ in range(99):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    assert k.stats.requests / 99 <= 2
    assert cluster.placements(k) == {"on-demand": 1, "spot": 99}


def test_a_reservation_whose_pod_came_and_went_between_two_counts_is_dropped() -> None:
    # GIVEN on-demand reservations whose pods were created and deleted before any count saw them
    k = FakeKube()
    cluster.basic_cluster(k)
    _, rs = cluster.deployment(k, "web", 4, annotations={"spotguard.io/min-on-demand": "2"})
    ctx = core.Context(Config(), k, trust_seconds=0.2, pending_grace=0.3, review_seconds=REVIEW_SECONDS)
    for _ in range(2):
        cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    for p in k.all(r.PODS, "shop"):
        del k.objects[("pods", "shop", p["metadata"]["name"])]
    time.sleep(0.4)
    # WHEN new pods come
    _, pod = cluster.admit_and_create(ctx, k, cluster.pod_for(rs))
    # THEN they take the slots again
    assert pod["metadata"]["labels"]["spotguard.io/placement"] == "on-demand"


# -- timings -----------------------------------------------------------------------------


def test_a_reservation_ttl_shorter_than_the_other_timings_is_raised_to_cover_them(k: FakeKube) -> None:
    ctx = core.Context(Config(), k, trust_seconds=3.0, pending_grace=1.0, review_seconds=2.0)
    minimum = 3.0 + 1.0 + 1.0 + 2 * 2.0  # trust + seen margin + grace + two review deadlines
    assert ctx.reservations.minimum_ttl() == minimum
    assert ctx.reservations.ttl(dataclasses.replace(Config(), reservation_ttl_seconds=2)) == minimum
    assert ctx.reservations.ttl(dataclasses.replace(Config(), reservation_ttl_seconds=45)) == 45


@pytest.mark.parametrize(
    ("env", "trust", "grace", "deadline"),
    [
        # the default deadline: the shipped webhook's 3 s but what the answer needs to travel back
        ({}, 3.0, 1.0, 2.55),
        ({"SPOTGUARD_ADMISSION_TRUST_SECONDS": "soon", "SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "-1"}, 3.0, 1.0, 2.55),
        ({"SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS": "5"}, 3.0, 1.275, 2.55),  # shortened to half the deadline
        (
            {"SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "10", "SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS": "5"},
            3.0,
            5.0,
            10.0,
        ),
    ],
)
def test_admission_timings_from_the_environment_are_validated(
    env: dict[str, str], trust: float, grace: float, deadline: float
) -> None:
    fake = FakeKube()
    ctx = core.context_from_env({"SPOTGUARD_NAMESPACE": "spotguard", **env}, connect=lambda _: fake)  # type: ignore[arg-type,return-value]
    assert (ctx.reservations.trust_seconds, ctx.reservations.pending_grace, ctx.review_seconds) == pytest.approx(
        (trust, grace, deadline)
    )


def test_a_review_past_its_deadline_is_allowed_unchanged_and_writes_nothing(k: FakeKube) -> None:
    _, rs = cluster.deployment(k, "web", 2)
    ctx = core.Context(Config(), k, "spotguard", review_seconds=0.0)
    shed = metrics.SHED._value.get()
    answer = core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
    assert "patch" not in answer["response"]
    # No time at all: shed at once, before any read (a review that runs out half-way fails open).
    assert answer["response"]["auditAnnotations"]["spotguard.io/decision"].startswith("shed:")
    assert metrics.SHED._value.get() == shed + 1
    assert k.stats.writes == 0 and k.stats.requests == 0


# -- a review taken up past its deadline ------------------------------------------------


def _placement_of(answer: Any) -> str | None:
    placed = answer["response"].get("auditAnnotations", {}).get("spotguard.io/placement")
    return str(placed) if placed else None


def test_a_review_taken_up_past_its_deadline_is_placed_from_what_is_known_while_its_caller_waits(
    k: FakeKube,
) -> None:
    # GIVEN a process that placed a Deployment's first pod (its ReplicaSet, Deployment, count known)
    _, rs = cluster.deployment(k, "web", 3)
    ctx = make_ctx(k)
    first = core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
    assert _placement_of(first) == "on-demand"
    shed = metrics.SHED._value.get()
    late = metrics.DEGRADED.labels("late")._value.get()
    # WHEN its next pod's review is taken up 2.7 s after it arrived (its deadline, 2.55 s of the
    # caller's 3 s, passed; the caller still waits 0.3 s)
    with deadline.arrived(time.monotonic() - 2.7, timeout=3.0):
        answer = core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
    # THEN it is placed (on spot: the floor is held) from what the process knows, not shed
    assert _placement_of(answer) == "spot"
    assert "patch" in answer["response"]
    assert metrics.SHED._value.get() == shed
    assert metrics.DEGRADED.labels("late")._value.get() == late + 1
    # AND one whose caller gave up already is shed, as before
    with deadline.arrived(time.monotonic() - 3.0, timeout=3.0):
        gone = core.serve(cluster.review(cluster.pod_for(rs), "shop"), ctx)
    assert "patch" not in gone["response"]
    assert metrics.SHED._value.get() == shed + 1


@pytest.mark.parametrize(
    ("value", "ttl"), [(None, 2.0), ("0.1", 0.1), ("0", 0.0), ("-1", 2.0), ("31", 2.0), ("nan", 2.0), ("soon", 2.0)]
)
def test_how_long_a_workload_read_is_kept_comes_from_the_environment(value: str | None, ttl: float) -> None:
    """$SPOTGUARD_WORKLOAD_CACHE_SECONDS: node-added's moves wait for it (its reconciler reads the
    same setting); an invalid value keeps the default."""
    from spotguard.gateway import settings
    from spotguard.nodeadded import reconciler

    env = {"SPOTGUARD_NAMESPACE": "spotguard"} | ({} if value is None else {"SPOTGUARD_WORKLOAD_CACHE_SECONDS": value})
    ctx = core.context_from_env(env, connect=lambda _: FakeKube())  # type: ignore[arg-type,return-value]
    assert ctx.resolver.workload_ttl == pytest.approx(ttl)
    assert settings.workload_cache_seconds(env) == pytest.approx(ttl)
    assert reconciler.ADMISSION_CACHE_SECONDS == settings.WORKLOAD_CACHE_SECONDS + reconciler.READ_IN_FLIGHT_SECONDS
