"""The simulated cluster authenticates and authorizes as kube-apiserver with RBAC.

Sources: kube-apiserver's RBAC authorizer (``plugin/pkg/auth/authorizer/rbac/rbac.go``,
``pkg/apis/rbac/v1/evaluation_helpers.go``, ``pkg/registry/rbac/validation/rule.go``),
its request attributes (``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``)
and its 403 (``.../handlers/responsewriters/errors.go``, ``apierrors.NewForbidden``);
https://kubernetes.io/docs/reference/access-authn-authz/rbac/ and
https://kubernetes.io/docs/reference/access-authn-authz/authentication/.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard_sim import objects, testing

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = str(ROOT / ".venv" / "bin" / "kubectl")
RBAC = "rbac.authorization.k8s.io"
SA = "system:serviceaccount:team:robot"


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster([objects.namespace("team"), objects.namespace("other")], controllers=False) as sim:
        sim.store.create("serviceaccounts", {"metadata": {"name": "robot", "namespace": "team"}})
        pod = {"metadata": {"name": "p", "namespace": "team"}, "spec": {"containers": [objects.container()]}}
        sim.store.create("pods", pod)
        sim.store.create("deployments", objects.deployment("web", 1, namespace="team"))
        yield sim


class Client:
    """Raw HTTP as one credential: the status code and the decoded body of each call."""

    def __init__(self, sim: testing.SimCluster, token: str | None = None, cert: tuple[bytes, bytes] | None = None,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self.sim = sim
        self.session = requests.Session()
        self.session.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
        ca = Path(sim.kubeconfig).with_name("ca-rbac.crt")
        assert sim.ca_pem is not None
        ca.write_bytes(sim.ca_pem)
        self.session.verify = str(ca)
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        if cert:
            cert_file, key_file = ca.with_name("client.crt"), ca.with_name("client.key")
            cert_file.write_bytes(cert[0])
            key_file.write_bytes(cert[1])
            self.session.cert = (str(cert_file), str(key_file))
        self.session.headers.update(headers or {})

    def call(self, method: str, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        reply = self.session.request(method, self.sim.url + path, json=body, params=params, headers=headers,
                                     timeout=30)  # fmt: skip
        try:
            return reply.status_code, reply.json()
        except ValueError:
            return reply.status_code, reply.text


def robot(sim: testing.SimCluster) -> Client:
    return Client(sim, token=sim.service_account_token("team", "robot"))


def create(sim: testing.SimCluster, plural: str, obj: dict[str, Any]) -> None:
    admin = Client(sim, token=sim.token)
    namespace = obj["metadata"].get("namespace")
    path = f"/apis/{RBAC}/v1" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    code, body = admin.call("POST", path, obj)
    assert code == 201, body


def binding(name: str, role_kind: str, role: str, subjects: list[dict[str, Any]], namespace: str | None = None) -> Any:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role}, "subjects": subjects}


def forbidden(message: str, kind: str, name: str = "", group: str = "") -> dict[str, Any]:
    details = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Forbidden", "details": details, "code": 403}  # fmt: skip


def test_a_request_no_role_allows_is_403_with_upstreams_status(sim: testing.SimCluster) -> None:
    client = robot(sim)
    assert client.call("GET", "/api/v1/namespaces/team/pods/p") == (403, forbidden(
        f'pods "p" is forbidden: User "{SA}" cannot get resource "pods" in API group "" in the namespace "team"',
        "pods", "p"))  # fmt: skip
    assert client.call("GET", "/api/v1/nodes") == (403, forbidden(
        f'nodes is forbidden: User "{SA}" cannot list resource "nodes" in API group "" at the cluster scope',
        "nodes"))  # fmt: skip
    assert client.call("POST", "/api/v1/namespaces/team/pods/p/eviction", {"metadata": {"name": "p"}}) == (
        403, forbidden(f'pods "p" is forbidden: User "{SA}" cannot create resource "pods/eviction" in API group "" '
                       'in the namespace "team"', "pods", "p"))  # fmt: skip
    assert client.call("PATCH", "/apis/apps/v1/namespaces/team/deployments/web/scale", {"spec": {"replicas": 2}}) == (
        403, forbidden(f'deployments.apps "web" is forbidden: User "{SA}" cannot patch resource "deployments/scale" '
                       'in API group "apps" in the namespace "team"', "deployments", "web", "apps"))  # fmt: skip
    # a resource the cluster does not serve is authorized first (403, not 404), as upstream
    code, body = client.call("GET", "/apis/karpenter.sh/v1/nodepools")
    assert code == 403 and body["message"].startswith("nodepools.karpenter.sh is forbidden: ")
    # the unchanged object: nothing was written
    assert sim.store.get("deployments", "web", "team")["spec"]["replicas"] == 1


def test_rules_match_verbs_resources_subresources_names_and_wildcards(sim: testing.SimCluster) -> None:
    create(sim, "roles", {"metadata": {"name": "picky", "namespace": "team"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get", "list"]},
        {"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]})  # fmt: skip
    create(
        sim, "rolebindings", binding("picky", "Role", "picky", [{"kind": "ServiceAccount", "name": "robot"}], "team")
    )  # the subject's namespace defaults to the binding's
    sim.store.create("configmaps", {"metadata": {"name": "settings", "namespace": "team"}})
    client = robot(sim)
    assert client.call("GET", "/api/v1/namespaces/team/configmaps/settings")[0] == 200
    assert client.call("GET", "/api/v1/namespaces/team/configmaps/other")[0] == 403
    assert client.call("GET", "/api/v1/namespaces/team/configmaps")[0] == 403  # a list names nothing
    # ... unless its field selector names exactly the one object
    assert client.call("GET", "/api/v1/namespaces/team/configmaps", fieldSelector="metadata.name=settings")[0] == 200
    assert client.call("GET", "/apis/apps/v1/namespaces/team/deployments/web/scale")[0] == 200  # */scale
    assert client.call("GET", "/apis/apps/v1/namespaces/team/deployments/web")[0] == 403  # not the resource
    assert client.call("GET", "/api/v1/namespaces/team/pods")[0] == 403  # watch is not list
    code, _ = client.call("DELETE", "/api/v1/namespaces/team/pods")  # delete is not deletecollection
    assert code == 403
    code, body = client.call("POST", "/api/v1/namespaces/team/pods/p/eviction", {"metadata": {"name": "p"}},
                             dryRun="All")  # fmt: skip
    assert code == 201, body
    assert client.call("GET", "/api/v1/namespaces/other/configmaps/settings")[0] == 403  # another namespace


def test_bindings_subjects_scopes_and_missing_roles(sim: testing.SimCluster) -> None:
    create(
        sim,
        "clusterroles",
        {
            "metadata": {"name": "node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes", "secrets"], "verbs": ["list"]}],
        },
    )
    # a ClusterRole through a RoleBinding grants in that namespace only
    create(sim, "rolebindings", binding("read", "ClusterRole", "node-reader", [{"kind": "Group", "name": "devs"}],
                                        "other"))  # fmt: skip
    jane = Client(sim, cert=sim.client_certificate("jane", ("devs",)))
    assert jane.call("GET", "/api/v1/namespaces/other/secrets")[0] == 200
    assert jane.call("GET", "/api/v1/namespaces/team/secrets")[0] == 403
    assert jane.call("GET", "/api/v1/nodes")[0] == 403
    create(sim, "clusterrolebindings", binding("jane-nodes", "ClusterRole", "node-reader",
                                               [{"kind": "User", "name": "jane", "apiGroup": RBAC}]))  # fmt: skip
    assert jane.call("GET", "/api/v1/nodes")[0] == 200
    bob = Client(sim, cert=sim.client_certificate("bob"))
    assert bob.call("GET", "/api/v1/nodes")[0] == 403
    # a binding whose role is missing: its error is the reason, appended to the message
    create(sim, "clusterrolebindings", binding("bob-gone", "ClusterRole", "gone",
                                               [{"kind": "User", "name": "bob", "apiGroup": RBAC}]))  # fmt: skip
    code, body = bob.call("GET", "/api/v1/nodes")
    assert (code, body["message"]) == (403, 'nodes is forbidden: User "bob" cannot list resource "nodes" in API group '
                                            '"" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io '
                                            '"gone" not found')  # fmt: skip


def test_authentication_tokens_certificates_and_anonymous(sim: testing.SimCluster) -> None:
    unauthorized = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Unauthorized", "reason": "Unauthorized", "code": 401}  # fmt: skip
    assert Client(sim, token="system:serviceaccount:team:robot").call("GET", "/api/v1/nodes") == (401, unauthorized)
    anonymous = Client(sim)
    assert anonymous.call("GET", "/version")[0] == 200  # system:public-info-viewer
    assert anonymous.call("GET", "/api") == (
        403,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'forbidden: User "system:anonymous" cannot get path "/api"',
            "reason": "Forbidden",
            "details": {},  # NewForbidden always sets Details: empty, not left out
            "code": 403,
        },
    )
    # every authenticated user may discover the API and ask what it may do
    client = robot(sim)
    assert client.call("GET", "/apis")[0] == 200
    code, body = client.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})  # fmt: skip
    assert code == 201 and body["status"]["userInfo"]["username"] == SA
    assert body["status"]["userInfo"]["groups"] == ["system:serviceaccounts", "system:serviceaccounts:team",
                                                    "system:authenticated"]  # fmt: skip
    # a token dies with its ServiceAccount (a new one of the same name has another uid)
    sim.store.create("serviceaccounts", {"metadata": {"name": "temp", "namespace": "team"}})
    temp = Client(sim, token=sim.service_account_token("team", "temp"))
    assert temp.call("GET", "/apis")[0] == 200
    sim.store.delete("serviceaccounts", "temp", "team")
    sim.store.create("serviceaccounts", {"metadata": {"name": "temp", "namespace": "team"}})
    assert temp.call("GET", "/apis") == (401, unauthorized)


def test_system_masters_may_do_anything_without_a_binding(sim: testing.SimCluster) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "masters"}})
    admin = Client(sim, cert=sim.client_certificate("root", ("system:masters",)))
    assert admin.call("GET", "/api/v1/nodes")[0] == 200
    assert admin.call("DELETE", "/api/v1/namespaces/masters/configmaps")[0] == 200


def test_impersonation_needs_the_impersonate_verb(sim: testing.SimCluster) -> None:
    client = Client(sim, token=sim.service_account_token("team", "robot"), headers={"Impersonate-User": "alice"})
    assert client.call("GET", "/apis")[1] == forbidden(
        f'users "alice" is forbidden: User "{SA}" cannot impersonate resource "users" in API group "" at the '
        "cluster scope", "users", "alice")  # fmt: skip
    as_robot = Client(sim, token=sim.token, headers={"Impersonate-User": SA})
    code, body = as_robot.call("GET", "/api/v1/nodes")
    assert code == 403 and f'User "{SA}"' in body["message"]


def test_subject_access_reviews_say_which_binding_allows(sim: testing.SimCluster) -> None:
    create(
        sim,
        "clusterroles",
        {
            "metadata": {"name": "lease-writer"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"]}],
        },
    )
    create(
        sim,
        "rolebindings",
        binding(
            "leases",
            "ClusterRole",
            "lease-writer",
            [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}],
            "team",
        ),
    )
    admin = Client(sim, token=sim.token)
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": SA, "groups": ["system:serviceaccounts"],
        "resourceAttributes": {"namespace": "team", "verb": "update", "group": "coordination.k8s.io",
                               "resource": "leases", "name": "x"}}}  # fmt: skip
    code, body = admin.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert code == 201, body
    assert body["status"] == {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "leases/team" of ClusterRole '
                                                         '"lease-writer" to ServiceAccount "robot/team"'}  # fmt: skip
    review["spec"]["resourceAttributes"]["namespace"] = "other"
    assert admin.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)[1]["status"] == {
        "allowed": False
    }
    # a service account may not ask about others
    code, _ = robot(sim).call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert code == 403


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_kubectl_auth_can_i_whoami_and_create_token(sim: testing.SimCluster, tmp_path: Path) -> None:
    create(
        sim,
        "roles",
        {
            "metadata": {"name": "pod-reader", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    create(
        sim,
        "rolebindings",
        binding(
            "pod-reader",
            "Role",
            "pod-reader",
            [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}],
            "team",
        ),
    )
    made = kubectl(sim.kubeconfig, "create", "token", "robot", "-n", "team", "--duration=1h")
    assert made.returncode == 0, made.stderr
    kubeconfig = sim.write_kubeconfig(tmp_path / "robot.kubeconfig", token=made.stdout.strip())
    yes = kubectl(kubeconfig, "auth", "can-i", "list", "pods", "-n", "team")
    assert (yes.returncode, yes.stdout.strip()) == (0, "yes")
    no = kubectl(kubeconfig, "auth", "can-i", "create", "pods", "-n", "team")
    assert (no.returncode, no.stdout.strip()) == (1, "no")
    assert kubectl(kubeconfig, "auth", "can-i", "list", "pods", "-n", "other").returncode == 1
    # the admin asks for the service account (impersonation)
    as_robot = kubectl(sim.kubeconfig, "auth", "can-i", "get", "pods", "-n", "team", "--as", SA)
    assert (as_robot.returncode, as_robot.stdout.strip()) == (0, "yes")
    listed = kubectl(kubeconfig, "auth", "can-i", "--list", "-n", "team")  # SelfSubjectRulesReview
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    pods = next(row for row in rows if row[0] == "pods")
    assert {"get", "list"} <= {verb.strip("[]") for verb in pods[3:]}, listed.stdout
    assert ["configmaps", "[]", "[settings]", "[get", "list]"] in rows, listed.stdout  # resourceNames
    assert ["selfsubjectaccessreviews.authorization.k8s.io", "[]", "[]", "[create]"] in rows  # system:basic-user
    whoami = kubectl(kubeconfig, "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == SA
    denied = kubectl(kubeconfig, "get", "nodes")
    assert denied.returncode == 1
    assert (f'Error from server (Forbidden): nodes is forbidden: User "{SA}" cannot list resource "nodes" in API '
            'group "" at the cluster scope') in denied.stderr  # fmt: skip


def test_aggregated_cluster_roles_take_the_rules_of_the_roles_they_select() -> None:
    """The clusterrole-aggregation controller (pkg/controller/clusterroleaggregation)."""
    label = {"rbac.example.com/aggregate-to-monitoring": "true"}
    with testing.running_cluster([objects.namespace("team")]) as sim:
        sim.store.create("serviceaccounts", {"metadata": {"name": "robot", "namespace": "team"}})
        aggregated = {"metadata": {"name": "monitoring"}, "rules": [],
                      "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": label}]}}  # fmt: skip
        create(sim, "clusterroles", aggregated)
        create(
            sim,
            "clusterrolebindings",
            binding(
                "monitoring",
                "ClusterRole",
                "monitoring",
                [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}],
            ),
        )
        client = robot(sim)
        assert client.call("GET", "/api/v1/nodes")[0] == 403
        feed = {"metadata": {"name": "monitoring-nodes", "labels": label},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}  # fmt: skip
        create(sim, "clusterroles", feed)
        wait(lambda: client.call("GET", "/api/v1/nodes")[0] == 200, "the aggregated rule")
        assert sim.store.get("clusterroles", "monitoring")["rules"] == feed["rules"]
        sim.store.delete("clusterroles", "monitoring-nodes")
        wait(lambda: client.call("GET", "/api/v1/nodes")[0] == 403, "the rule gone with its role")


def wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
