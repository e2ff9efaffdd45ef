"""RBAC is least privilege: every Role and ClusterRole in infra/ grants exactly what its
function's code uses, and the code uses nothing else.

:data:`NEEDS` declares, per function, each permission and where the code uses it.
Two checks hold the declaration to the truth from both sides:

- the rendered manifests (kustomize, Helm, Knative) grant exactly :data:`NEEDS`:
  nothing more (least privilege: no watch nobody does, no verb nobody sends) and
  nothing less (a missing grant is a 403 in production);
- the shipped servers, run against the simulated cluster through a whole
  interruption (admission of every pod, the notice, the surge, a drainer evicting
  at the notice through the eviction guard, the reclaim, the scale-back,
  spot-interruption draining the doomed node itself with ``SPOTGUARD_DRAIN=true``,
  then node-added passes once new spot nodes join), each as its own service
  account with the roles the chart or the kustomize base ships (applied with
  ``kubectl apply``, tokens from ``kubectl create token``; the simulated cluster
  authorizes every request as kube-apiserver's RBAC does), decide with the API (the
  eviction guard never fails open) and report on ``/metrics``
  (``spotguard_kube_requests_total``) every request they made: each is declared, and
  each declared permission is used (or is listed in :data:`NOT_EXERCISED` with the
  reason);
- each EKS access entry of infra/aws/template.yaml maps its Lambda's principal to
  groups that the kustomize roles allow exactly what its function needs (checked
  with an EKS token the Lambdas' own code signs, by SelfSubjectAccessReview).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from spotguard.admission import registration
from spotguard.gateway import eks, kube
from spotguard.gateway import resources as r
from spotguard.policy.moves import MOVE
from spotguard.policy.workloads import SURGE_OF
from spotguard_sim import objects, testing

from tests.fuzz import processes
from tests.infra import test_manifests as manifests
from tests.nodeadded import test_transports as node_added_transports
from tests.records import surge_record

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
INFRA = ROOT / "infra"
EVENTS = ROOT / "tests" / "events"

CLUSTER = "cluster"  # a ClusterRole
OWN = "spotguard"  # a Role in the spotguard namespace
HEADROOM = "spotguard-headroom"  # node-added's headroom Deployment (spotguard.policy.headroom.NAME)


@dataclass(frozen=True, order=True)
class Grant:
    scope: str  # CLUSTER or the Role's namespace
    group: str
    resource: str  # "deployments", "pods/eviction"
    verb: str
    names: tuple[str, ...] = ()  # resourceNames


def needs(scope: str, group: str, resources: str, verbs: str, names: tuple[str, ...] = ()) -> set[Grant]:
    return {Grant(scope, group, res, verb, names) for res in resources.split() for verb in verbs.split()}


CONFIG = needs(OWN, "", "configmaps", "get", ("spotguard-config",))  # gateway/settings.py: the ConfigMap
# interruption/ledger.py: the surge ledger, ConfigMaps spotguard-surges-<namespace> (list and
# create cannot be limited by name, so none of these are).
LEDGER = needs(OWN, "", "configmaps", "get list create update delete")
# What interruption/handler.py's reconcile writes: node-added calls it on every pass.
INTERRUPTION_RECONCILE = set().union(
    needs(CLUSTER, "", "pods nodes namespaces", "list"),  # handler.py: the snapshot
    needs(CLUSTER, "apps", "deployments statefulsets", "list"),  # handler.py: the snapshot
    needs(CLUSTER, "policy", "poddisruptionbudgets", "list"),  # handler.py: the snapshot
    needs(CLUSTER, "autoscaling", "horizontalpodautoscalers", "list"),  # handler.py: the snapshot
    needs(CLUSTER, "", "nodes", "get patch"),  # handler.py: the taint (re-read on conflict), its removal
    needs(CLUSTER, "", "pods", "patch"),  # handler.py: doomed pods ranked first at the scale-back
    needs(CLUSTER, "", "pods/eviction", "create"),  # handler.py: the drain (SPOTGUARD_DRAIN=true)
    needs(CLUSTER, "apps", "deployments", "get patch"),  # handler.py: surge and scale-back (re-read on conflict)
    needs(CLUSTER, "policy", "poddisruptionbudgets", "create delete"),  # handler.py: the temporary budget
    needs(CLUSTER, "autoscaling", "horizontalpodautoscalers", "get patch"),  # minReplicas raised (re-read on conflict)
    needs(CLUSTER, "", "events", "create"),  # handler.py: what it did, on the objects
    # handler.py: the surge copies (surge_copy), spotguard's own ReplicaSets carrying each
    # surge's record: listed with the snapshot (and by the reconcile's first look), created,
    # resized and given a newer record (a patch guarded by the resourceVersion; read again
    # after a conflict), deleted.
    needs(CLUSTER, "apps", "replicasets", "get list create patch delete"),
    LEDGER,
    CONFIG,
)
NEEDS: dict[str, set[Grant]] = {
    "spotguard-admission": set().union(
        needs(CLUSTER, "", "namespaces", "get"),  # admission/resolve.py: opted-out namespaces
        # resolve.py: the pod's owners; admission/evictions.py: a Deployment's surge copy (its record)
        needs(CLUSTER, "apps", "replicasets deployments statefulsets", "get"),
        needs(CLUSTER, "", "nodes", "list"),  # resolve.py: node capacity
        needs(CLUSTER, "", "pods", "list"),  # admission/reservations.py: the pods placed so far
        needs(CLUSTER, "", "pods nodes", "get"),  # admission/evictions.py: the pod under eviction, its node
        needs(CLUSTER, "", "events", "create"),  # core.py: invalid annotations reported
        needs(CLUSTER, "karpenter.sh", "nodepools", "list"),  # admission/launches.py: can on-demand be launched?
        needs(OWN, "coordination.k8s.io", "leases", "get create update"),  # reservations.py: the slots
        CONFIG,
    ),
    "spotguard-spot-interruption": INTERRUPTION_RECONCILE,
    "spotguard-node-added": set().union(
        INTERRUPTION_RECONCILE,  # nodeadded/reconciler.py: every pass runs that reconcile first
        needs(CLUSTER, "", "nodes", "get"),  # nodeadded/service.py: has the added node joined?
        needs(CLUSTER, "", "pods", "patch"),  # reconciler.py: the pod a move removes is ranked first
        # reconciler.py: StatefulSet moves (budgets respected); pods left Pending on a move's spot requirement
        needs(CLUSTER, "", "pods/eviction", "create"),
        needs(CLUSTER, "apps", "deployments statefulsets", "patch"),  # reconciler.py: the move record, replicas
        needs(CLUSTER, "apps", "replicasets", "list"),  # reconciler.py: Leases whose ReplicaSet is gone
        needs(OWN, "coordination.k8s.io", "leases", "list delete"),  # nodeadded/cleanup.py: those Leases
        needs(CLUSTER, "karpenter.sh", "nodepools", "list"),  # reconciler.py: can spot be launched?
        # nodeadded/headroom.py: the headroom Deployment, in spotguard's namespace only (resized
        # with the cluster-wide Deployment patch above)
        needs(OWN, "apps", "deployments", "create"),
        needs(OWN, "apps", "deployments", "delete", (HEADROOM,)),
    ),
    "spotguard-node-events": needs(CLUSTER, "", "nodes", "get list watch"),  # Knative ApiServerSource's adapter
}

# Declared but not exercised by the run below, each with the reason.
CONFLICT_REREADS = (
    needs(CLUSTER, "apps", "deployments", "get")
    | needs(CLUSTER, "autoscaling", "horizontalpodautoscalers", "get")
    | needs(CLUSTER, "apps", "replicasets", "get")
)
# The run surges one way: ``spec.replicas`` (the autoscaler's minimum raised with it) or a
# copy (SPOTGUARD_SURGE_COPY: a ReplicaSet of spotguard's; the autoscaler left alone).
COPY_WRITES = needs(CLUSTER, "apps", "replicasets", "create patch delete")
NOT_IN_MODE: dict[str, dict[str, set[Grant]]] = {
    "replicas": {
        "spotguard-spot-interruption": COPY_WRITES | needs(CLUSTER, "apps", "replicasets", "list"),
        "spotguard-node-added": COPY_WRITES,
    },
    "copy": {
        # A copy's surge writes nothing on the Deployment: its patch is the replica surge's
        # (and the end of a record a surge begun before wrote there).
        "spotguard-spot-interruption": needs(CLUSTER, "apps", "deployments", "patch")
        | needs(CLUSTER, "autoscaling", "horizontalpodautoscalers", "patch")
        # A resize between the copy's creation and its deletion happens only where the
        # Deployment's replacements come Ready one pass apart (tests/interruption proves it).
        | needs(CLUSTER, "apps", "replicasets", "patch"),
        # Its reconcile's copy writes finish a handling: the spot-interruption server's own
        # reconcile does here (see below).
        "spotguard-node-added": COPY_WRITES,
    },
}
NOT_EXERCISED: dict[str, set[Grant]] = {
    # Read only while no on-demand node is in a pod's reach: this run has on-demand nodes
    # (tests/admission/test_autoscaled_floors.py reads them under the shipped roles).
    "spotguard-admission": needs(CLUSTER, "karpenter.sh", "nodepools", "list"),
    # Re-read only after a 409 Conflict on the taint, the surge or the autoscaler.
    "spotguard-spot-interruption": needs(CLUSTER, "", "nodes", "get")
    | CONFLICT_REREADS
    # Doomed pods ranked first at a scale-back that comes while they still run: here the
    # drain evicts them first and the reclaim removes the node (tests/chaos ranks them).
    | needs(CLUSTER, "", "pods", "patch")
    # The ledger rewrites a namespace's ConfigMap only when a second workload there holds
    # an entry beside the first: this run surges web alone (create, then delete).
    | needs(OWN, "", "configmaps", "update"),
    # The writes of the spot-interruption reconcile (the same code, proven by the
    # spot-interruption run) that only finish a handling: in this run the
    # spot-interruption server finishes its own first, so a node-added pass finds
    # nothing half-done (and, with nothing to finish, does not read the autoscalers or
    # write the ledger). Plus the re-reads after a conflict.
    "spotguard-node-added": CONFLICT_REREADS
    # StatefulSet moves: db sits at its optimum when spot returns in this run (proven
    # in-process by tests/nodeadded/test_rebalance_e2e.py, which has no per-grant counter).
    # The eviction of a pod left Pending on a move's spot requirement: no move here leaves
    # one (tests/nodeadded/test_launch_e2e.py evicts one under the shipped roles).
    | needs(CLUSTER, "apps", "statefulsets", "patch")
    | needs(CLUSTER, "", "pods/eviction", "create")
    | needs(CLUSTER, "", "nodes", "patch")
    | needs(CLUSTER, "policy", "poddisruptionbudgets", "create delete")
    | needs(CLUSTER, "autoscaling", "horizontalpodautoscalers", "list patch")
    | needs(OWN, "", "configmaps", "get create update delete")
    # The on-demand headroom is off by default (as in this run): its writes run under the
    # shipped roles in tests/nodeadded/test_headroom_e2e.py.
    | needs(OWN, "apps", "deployments", "create")
    | needs(OWN, "apps", "deployments", "delete", (HEADROOM,)),
}


# -- the rendered manifests --------------------------------------------------------------


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup")
    return str(path)


@cache
def rendered(source: str) -> tuple[dict[str, Any], ...]:
    if source.startswith("helm"):
        # certs.mode=generate (the default) refuses a render without a cluster; RBAC is the same in every mode
        chart = str(INFRA / "helm" / "spotguard")
        command = [tool("helm"), "template", "spotguard", chart, "--namespace", "spotguard"]
        command += ["--set", "certs.mode=cert-manager"]
    else:
        command = [tool("kubectl"), "kustomize", str(INFRA / source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


SOURCES = ["kubernetes/base", "kubernetes/cert-manager", "knative", "helm"]


def grants(role: dict[str, Any]) -> set[Grant]:
    scope = CLUSTER if role["kind"] == "ClusterRole" else role["metadata"]["namespace"]
    out = set()
    for rule in role.get("rules") or []:
        names = tuple(sorted(rule.get("resourceNames") or ()))
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    out.add(Grant(scope, group, resource, verb, names))
    return out


def roles(source: str) -> Iterator[dict[str, Any]]:
    for obj in rendered(source):
        if obj.get("kind") in ("Role", "ClusterRole"):
            yield obj


@pytest.mark.parametrize("source", SOURCES)
def test_no_role_grants_wildcards_secrets_or_escalation(source: str) -> None:
    found = list(roles(source))
    assert found, f"{source}: no Role or ClusterRole rendered"
    for role in found:
        where = f"{source}: {role['kind']} {role['metadata']['name']}"
        assert "aggregationRule" not in role, where
        for rule in role.get("rules") or []:
            assert "nonResourceURLs" not in rule, where
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in item for item in rule.get(key) or []), f"{where}: wildcard in {key}"
        for grant in grants(role):
            assert grant.resource.split("/")[0] not in ("secrets", "serviceaccounts"), f"{where}: {grant}"
            assert grant.verb not in ("escalate", "bind", "impersonate", "deletecollection", "*"), f"{where}: {grant}"
            assert not grant.group.startswith("rbac.authorization.k8s.io"), f"{where}: {grant}"


@pytest.mark.parametrize("source", SOURCES)
def test_each_role_grants_exactly_what_its_function_needs(source: str) -> None:
    by_name: dict[str, set[Grant]] = {}
    for role in roles(source):
        by_name.setdefault(role["metadata"]["name"], set()).update(grants(role))
    assert set(by_name) <= set(NEEDS), f"{source}: roles with no declared needs"
    for name, granted in by_name.items():
        extra = sorted(granted - NEEDS[name])
        missing = sorted(NEEDS[name] - granted)
        assert not extra, f"{source}: {name} grants more than its code uses: {extra}"
        assert not missing, f"{source}: {name} lacks what its code uses (a 403): {missing}"


def bound(source: str, account: str) -> set[Grant]:
    """What the service account ``account`` of the spotguard namespace may do through the
    bindings ``source`` renders (a RoleBinding grants in its own namespace, whatever it
    binds; a ClusterRoleBinding grants a ClusterRole's rules cluster-wide)."""
    objs = rendered(source)
    defined = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in roles(source)}
    out: set[Grant] = set()
    for binding in objs:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace") == OWN for s in subjects):  # fmt: skip
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = defined.get((ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"]))
        assert role is not None, f"{source}: {binding['kind']} {binding['metadata']['name']} binds a missing {ref}"
        scope = CLUSTER if binding["kind"] == "ClusterRoleBinding" else namespace
        out |= {replace(g, scope=scope) for g in grants(role)}
    return out


@pytest.mark.parametrize("source", SOURCES)
def test_each_service_account_is_bound_to_exactly_its_functions_needs(source: str) -> None:
    """What the run below proves for one source holds for every source: the same grants
    reach the same service accounts (roles equal is not enough: a binding to the wrong
    account, namespace or role would differ)."""
    accounts = {o["metadata"]["name"] for o in rendered(source) if o.get("kind") == "ServiceAccount"}
    assert {f"spotguard-{f}" for f in FUNCTIONS} <= accounts, f"{source}: service accounts {sorted(accounts)}"
    for account in sorted(accounts & set(NEEDS)):
        got = bound(source, account)
        assert got == NEEDS[account], (
            f"{source}: {account} extra {sorted(got - NEEDS[account])}, missing {sorted(NEEDS[account] - got)}"
        )


# -- what the code really sends ----------------------------------------------------------

BY_NAME = {res.name: res for res in r.ALL}


def used(metrics_url: str, verify: str | bool) -> set[Grant]:
    """The permissions behind every request in ``spotguard_kube_requests_total``."""
    text = requests.get(metrics_url, verify=verify, timeout=10).text
    out = set()
    for family in text_string_to_metric_families(text):
        if family.name != "spotguard_kube_requests":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total") or sample.value <= 0:
                continue
            name, _, sub = sample.labels["resource"].partition("/")
            res = BY_NAME[name]
            resource = f"{res.plural}/{sub}" if sub else res.plural
            scope = OWN if res in (r.LEASES, r.CONFIGMAPS) else CLUSTER
            verb = sample.labels["verb"]
            if res is r.CONFIGMAPS and verb == "get":
                # The counter does not name the object: a get is the settings' read. The
                # ledger reads its ConfigMap (get) before every write: a write proves it.
                out.add(Grant(scope, res.group, resource, verb, ("spotguard-config",)))
                continue
            if res is r.CONFIGMAPS and verb in ("create", "update", "delete"):
                out.add(Grant(scope, res.group, resource, "get"))
            out.add(Grant(scope, res.group, resource, verb))
    return out


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


SPOT = {"spot-a": "i-1234567890abcdef0", "spot-b": "i-0b662ef9931388ba0"}


def scenario() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [objects.namespace("shop"), objects.namespace("spotguard")]
    for name, instance in SPOT.items():
        out.append(
            objects.node(name, "spot", cpu="8", memory="32Gi", provider=objects.provider_id("us-east-1a", instance))
        )
    for i in range(2):
        out.append(
            objects.node(
                f"od-{i}",
                "on-demand",
                cpu="8",
                memory="32Gi",
                provider=objects.provider_id("us-east-1a", f"i-0aaaaaaaaaaaaaa{i}"),
            )
        )
    return out


def template(name: str) -> dict[str, Any]:
    return objects.pod_template(name, containers=[objects.container(name, cpu="100m")], terminationGracePeriodSeconds=0)


def ready(k: kube.Kube, app: str) -> int:
    def is_ready(pod: dict[str, Any]) -> bool:
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    pods = k.list(r.PODS, "shop", label_selector=f"app={app}")
    return sum(1 for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp"))


def cloudevent(served: processes.Served, name: str) -> dict[str, Any]:
    """POST a sample CloudEvent of tests/events; the answer's data."""
    sample = json.loads((EVENTS / name).read_text())
    answer = requests.post(served.url + "/", headers=sample["headers"], data=sample["body"], timeout=120)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = json.loads(answer.content)["data"]
    return data


def on_spot(k: kube.Kube, app: str) -> int:
    pods = k.list(r.PODS, "shop", label_selector=f"app={app}")
    return sum(1 for p in pods if (p["spec"].get("nodeName") or "").startswith("spot-"))


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
FUNCTIONS = ("admission", "spot-interruption", "node-added")


def kubectl(kubeconfig: str, *args: str) -> str:
    done = subprocess.run([tool("kubectl"), "--kubeconfig", kubeconfig, *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def install_rbac(sim: testing.SimCluster, source: str, workdir: Path) -> dict[str, str]:
    """``kubectl apply`` the service accounts, roles and bindings that ``source`` renders; a
    kubeconfig per function acting as its service account (``kubectl create token``)."""
    manifest = workdir / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all([d for d in rendered(source) if d.get("kind") in RBAC_KINDS]))
    kubectl(sim.kubeconfig, "apply", "-f", str(manifest))
    kubeconfigs = {}
    for function in FUNCTIONS:
        account = f"spotguard-{function}"
        token = kubectl(sim.kubeconfig, "create", "token", account, "-n", OWN, "--duration=48h").strip()
        kubeconfigs[function] = sim.write_kubeconfig(workdir / f"{function}.kubeconfig", token=token)
        whoami = kubectl(kubeconfigs[function], "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
        assert whoami == f"system:serviceaccount:{OWN}:{account}"
    return kubeconfigs


def evictions_reviewed(metrics_url: str, verify: str | bool) -> dict[str, float]:
    """The eviction guard's answers by reason (``spotguard_admission_evictions_total``)."""
    text = requests.get(metrics_url, verify=verify, timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "spotguard_admission_evictions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    reason = sample.labels["reason"]
                    out[reason] = out.get(reason, 0.0) + sample.value
    return out


# A whole interruption and return to spot at x10 takes about 260 s on an idle 2-core machine;
# each phase has a bound of its own (wait_for), so the test's is their sum, not 300 s.
@pytest.mark.timeout(1500)
# Helm is the default install; the kustomize base binds the same grants to the same accounts
# (test_each_service_account_is_bound_to_exactly_its_functions_needs), so its run proves
# nothing more and is in the full end-to-end run only (SPOTGUARD_E2E=full). The replica
# surge (SPOTGUARD_SURGE_COPY=false; the copy is the default) runs beside it in the full
# run: its writes are other grants.
@pytest.mark.parametrize(
    ("source", "mode"),
    [
        pytest.param("kubernetes/base", "copy", marks=pytest.mark.e2e_full),
        ("helm", "copy"),
        pytest.param("helm", "replicas", marks=pytest.mark.e2e_full),
    ],
)
def test_the_servers_use_exactly_the_declared_permissions(tmp_path: Path, source: str, mode: str) -> None:
    """GIVEN the three servers on a simulated cluster that authorizes as kube-apiserver,
    each as its service account with the roles ``source`` ships (spot-interruption
    draining doomed nodes itself, and a drainer that evicts at the notice through the
    eviction guard; the surge in ``spec.replicas`` or, ``copy``, a surge copy), WHEN pods
    are admitted, a notice is handled to the end, and new spot nodes join, THEN the guard
    decided every eviction (never failed open), every request they made is declared, and
    every declared permission was used."""
    copy = {"SPOTGUARD_SURGE_COPY": "true" if mode == "copy" else "false"}
    with testing.running_cluster(scenario(), time_scale=10, termination_seconds=0.2, drainer=True) as sim:
        kubeconfigs = install_rbac(sim, source, tmp_path)
        with (
            processes.admission(tmp_path, kubeconfigs["admission"]) as webhook,
            processes.spot_interruption(
                tmp_path,
                kubeconfigs["spot-interruption"],
                reconcile_interval=0.5,
                env={"SPOTGUARD_DRAIN": "true", **copy},
            ) as interruption,
            processes.node_added(
                tmp_path, kubeconfigs["node-added"], env={"SPOTGUARD_NODE_JOIN_WAIT_SECONDS": "1", **copy}
            ) as node_added,
        ):
            seen = interrupt(sim, webhook, interruption, node_added, copy=mode == "copy")
    admission_used, interruption_used, node_added_used, guard = seen

    assert sum(guard.values()) > 0, "the drainer's evictions never reached the eviction guard"
    failed = {reason: n for reason, n in guard.items() if reason.startswith(("failed-open", "no-cluster"))}
    assert not failed, f"the eviction guard could not decide (its answers: {guard})"
    runs = (
        ("spotguard-admission", admission_used),
        ("spotguard-spot-interruption", interruption_used),
        ("spotguard-node-added", node_added_used),
    )
    for name, seen in runs:
        undeclared = sorted(seen - NEEDS[name])
        unused = sorted(NEEDS[name] - seen - NOT_EXERCISED.get(name, set()) - NOT_IN_MODE[mode].get(name, set()))
        assert not undeclared, f"{name} sent requests its roles do not allow: {undeclared}"
        assert not unused, f"{name} is granted what it never used: {unused}"


def interrupt(
    sim: testing.SimCluster,
    webhook: processes.Served,
    interruption: processes.Served,
    node_added: processes.Served,
    copy: bool = False,
) -> tuple[set[Grant], set[Grant], set[Grant], dict[str, float]]:
    """A whole interruption, then spot's return; what each server used and the guard's answers.
    ``copy``: the surge is a copy (seen made, then gone with the surge), web's count untouched."""
    k = kube.Kube(sim.api_client())
    ca = base64.b64encode(Path(str(webhook.verify)).read_bytes()).decode()
    registration.register(sim.store, webhook.url, ca)  # the pod webhook and the eviction guard, as shipped
    k.create(r.DEPLOYMENTS, objects.deployment("web", 4, namespace="shop", template=template("web")), "shop")
    invalid = {"spotguard.io/min-on-demand": "many"}  # reported with an Event
    odd = objects.deployment("odd", 2, namespace="shop", template=template("odd"), annotations=invalid)
    k.create(r.DEPLOYMENTS, odd, "shop")
    db = objects.statefulset("db", 3, namespace="shop", template=template("db"), policy="Parallel")
    k.create(r.STATEFULSETS, db, "shop")
    k.create(r.HPAS, objects.hpa("web", "web", 4, 10, namespace="shop"), "shop")
    wanted = {"web": 4, "db": 3, "odd": 2}
    wait_for(lambda: all(ready(k, app) >= n for app, n in wanted.items()), 240, "the workloads Ready")
    doomed = [
        p["spec"]["nodeName"]
        for p in k.list(r.PODS, "shop", label_selector="app=web")
        if p["spec"].get("nodeName", "").startswith("spot-")
    ]
    assert doomed, "no web pod on spot: the webhook did not place any"
    node = doomed[0]
    # The other spot node is full (cordoned): the drained pods' replacements spill to
    # on-demand, so once new spot nodes join there is a replica for node-added to move
    # back. (The scale back itself removes the surge's own on-demand replicas first.)
    for other in SPOT:
        if other != node:
            sim.store.mutate("nodes", other, None, lambda n: n["spec"].__setitem__("unschedulable", True))
    notice = json.loads((EVENTS / "ec2-spot-instance-interruption-warning.json").read_text())
    notice["detail"]["instance-id"] = SPOT[node]
    notice["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    answer = requests.post(
        interruption.url + "/",
        data=json.dumps(notice),
        headers={
            "ce-specversion": "1.0",
            "ce-id": "rbac-1",
            "ce-source": "test",
            "ce-type": "dev.knative.eventing.aws-sqs",
            "Content-Type": "application/json",
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.content)["data"]["result"] == "done", answer.text
    # The record: on the copy (a copy's surge writes nothing on the Deployment), or on the Deployment.
    surged = lambda: surge_record(sim.store, "web") is not None  # noqa: E731
    copies = lambda: k.list(r.REPLICASETS, "shop", label_selector=SURGE_OF)  # noqa: E731
    assert surged()
    assert bool(copies()) == copy
    assert not copy or k.get(r.DEPLOYMENTS, "web", "shop")["spec"]["replicas"] == 4  # the copy surges
    # The reclaim two minutes after the notice; the drainer (as aws-node-termination-handler)
    # cordons and evicts at once, each eviction reviewed by the guard. spotguard also
    # evicts web's doomed pods itself once their replacements are Ready.
    sim.reclaim([node], after_seconds=120)
    doomed_web = lambda: [  # noqa: E731
        p for p in k.list(r.PODS, "shop", label_selector="app=web") if p["spec"].get("nodeName") == node
    ]
    wait_for(lambda: not doomed_web(), 240, "the drain of web's pods on the doomed node")
    over = lambda: not surged() and not k.list(r.PODDISRUPTIONBUDGETS, "shop") and not copies()  # noqa: E731
    wait_for(over, 300, "the scale-back")

    # node-added: an orphaned reservation Lease is cleaned up, and once new spot nodes
    # join, passes move replicas back to spot (StatefulSets through the Eviction API).
    orphans = node_added_transports.Orphans(k)
    lease = orphans.plant()
    # Counted before the first node-added event: that event's own pass may already start the
    # move (and its new replica be bound to a spot node before a later count).
    before = on_spot(k, "web")
    sim.store.apply_objects(
        [
            objects.node(f"spot-new-{i}", "spot", cpu="8", memory="32Gi",
                         provider=objects.provider_id("us-east-1a", f"i-0ccccccccccccccc{i}"))
            for i in range(2)
        ]
    )  # fmt: skip
    data = cloudevent(node_added, "cloudevent-apiserversource-node.binary.json")
    assert data["result"] == "reconciled", data
    assert not orphans.exists(lease)

    def moved_back() -> bool:
        # A move over (its record gone: scaled back, the autoscaler's minimum restored) that
        # left more of web on spot than before the nodes joined.
        cloudevent(node_added, "cloudevent-ping.binary.json")
        annotations = k.get(r.DEPLOYMENTS, "web", "shop")["metadata"].get("annotations") or {}
        return MOVE not in annotations and on_spot(k, "web") > before

    # (before node-added judged pods' ages on the API server's clock, it skipped web as
    # "settling" here for 150-240 s: the simulated cluster's timestamps run ahead of its own
    # clock at x10, as a control plane's may run ahead of a skewed instance's; the bound
    # keeps that slack for a loaded machine)
    wait_for(moved_back, 480, "node-added to move a web replica back to spot")
    return (
        used(webhook.url + "/metrics", webhook.verify),
        used(interruption.url + "/metrics", False),
        used(node_added.url + "/metrics", False),
        evictions_reviewed(webhook.url + "/metrics", webhook.verify),
    )


def can(sim: testing.SimCluster, token: str, grant: Grant) -> bool:
    """A SelfSubjectAccessReview of ``grant`` as ``token``'s user."""
    resource, _, subresource = grant.resource.partition("/")
    attributes = {
        "verb": grant.verb, "group": grant.group, "resource": resource, "subresource": subresource,
        "namespace": "" if grant.scope == CLUSTER else grant.scope, "name": grant.names[0] if grant.names else "",
    }  # fmt: skip
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}  # fmt: skip
    ca = Path(sim.kubeconfig).with_name("ca-eks.crt")
    ca.write_bytes(sim.ca_pem or b"")
    with requests.Session() as session:
        session.trust_env = False
        answer = session.post(sim.url + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review,
                              headers={"Authorization": f"Bearer {token}"}, verify=str(ca), timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    return bool(answer.json()["status"]["allowed"])


def test_each_eks_access_entry_gets_what_its_function_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the roles the kustomize base ships on a simulated cluster that authenticates EKS
    tokens by access entry, WHEN each Lambda's IAM principal signs a token (as the Lambdas
    do), THEN the Kubernetes groups of its access entry in infra/aws/template.yaml are
    allowed every permission its function needs, and no more than that."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    entries = manifests.resources("AWS::EKS::AccessEntry")
    assert entries
    with testing.running_cluster([objects.namespace("spotguard")], controllers=False) as sim:
        install_rbac(sim, "kubernetes/base", tmp_path)
        for i, entry in enumerate(sorted(entries)):
            groups = entries[entry]["Properties"]["KubernetesGroups"]
            [group] = groups
            role = "spotguard-" + group.split(":", 1)[1]
            access_key = f"AKIAEXAMPLE{i:09d}"
            sim.map_aws_access_key(access_key, f"arn:aws:sts::123456789012:assumed-role/{entry}/lambda", tuple(groups))
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
            token = eks.token("prod", eks.sts_client(boto3.session.Session(region_name="us-east-1")))
            missing = sorted(g for g in NEEDS[role] if not can(sim, token, g))
            assert not missing, f"{entry} ({group}) lacks: {missing}"
            assert not can(sim, token, Grant(CLUSTER, "", "secrets", "list")), f"{entry} may list secrets"
