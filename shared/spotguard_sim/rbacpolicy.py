"""The RBAC objects kube-apiserver creates at start (its ``rbac/bootstrap-roles``
post-start hook), those the simulated cluster's users need.

Source: ``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`` and
``controller_policy.go`` (kubernetes/kubernetes; their ``testdata/*.yaml`` list the
result). Only these are created: ``cluster-admin`` (bound to ``system:masters``),
``system:discovery``, ``system:basic-user`` and ``system:public-info-viewer`` (what
every authenticated user may read and ask), and ``system:controller:replicaset-controller``
(a test can act as that controller over HTTP by impersonating its service account).
The aggregated ``admin``/``edit``/``view`` roles and the other controllers' roles are
not created.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
_META = {"labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}}
_DISCOVERY = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
              "/readyz", "/version", "/version/"]
_PUBLIC = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
_APPS = ["apps", "extensions"]


def _role(name: str, rules: list[Obj]) -> tuple[str, Obj]:
    return "clusterroles", {"metadata": {"name": name, **_META}, "rules": rules}


def _binding(name: str, subjects: list[Obj]) -> tuple[str, Obj]:
    return "clusterrolebindings", {
        "metadata": {"name": name, **_META},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    }


def _group(name: str) -> Obj:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}


def bootstrap_objects() -> list[tuple[str, Obj]]:
    authenticated = _group("system:authenticated")
    return [
        _role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        _binding("cluster-admin", [_group("system:masters")]),
        _role("system:discovery", [{"nonResourceURLs": _DISCOVERY, "verbs": ["get"]}]),
        _binding("system:discovery", [authenticated]),
        _role("system:basic-user", [
            {"apiGroups": ["authorization.k8s.io"],
             "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
        ]),
        _binding("system:basic-user", [authenticated]),
        _role("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC, "verbs": ["get"]}]),
        _binding("system:public-info-viewer", [authenticated, _group("system:unauthenticated")]),
        _role("system:controller:replicaset-controller", [
            {"apiGroups": _APPS, "resources": ["replicasets"], "verbs": ["get", "list", "update", "watch"]},
            {"apiGroups": _APPS, "resources": ["replicasets/status"], "verbs": ["update"]},
            {"apiGroups": _APPS, "resources": ["replicasets/finalizers"], "verbs": ["update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "list", "patch", "watch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        ]),
        _binding("system:controller:replicaset-controller",
                 [{"kind": "ServiceAccount", "name": "replicaset-controller", "namespace": "kube-system"}]),
    ]
