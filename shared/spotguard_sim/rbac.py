"""The RBAC authorizer, as kube-apiserver's (``--authorization-mode=RBAC``).

Sources (kubernetes/kubernetes): ``plugin/pkg/auth/authorizer/rbac/rbac.go``
(``RuleAllows``), ``pkg/apis/rbac/v1/evaluation_helpers.go`` (verb, group, resource,
``*/subresource``, resourceName and non-resource URL matching),
``pkg/registry/rbac/validation/rule.go`` (``VisitRulesFor``: every ClusterRoleBinding,
then the RoleBindings of the request's namespace; subjects User, Group, ServiceAccount;
a binding whose role is missing adds a resolution error to the reason), and
``pkg/kubeapiserver/authorizer`` (the ``system:masters`` group is allowed everything
before RBAC is asked). Nothing is cached across a change: each role or binding
written is in force for the next request, as the informer-fed authorizer is within
milliseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotguard_sim.store import Store

MASTERS = "system:masters"
PLURALS = ("roles", "rolebindings", "clusterroles", "clusterrolebindings")
Rule = Mapping[str, Any]


@dataclass(frozen=True)
class Attributes:
    """authorizer.Attributes: who asks to do what (a resource or a non-resource request)."""

    user: Mapping[str, Any]
    verb: str
    resource_request: bool
    namespace: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""

    @property
    def username(self) -> str:
        return str(self.user.get("username") or "")

    @property
    def groups(self) -> list[str]:
        return [str(g) for g in self.user.get("groups") or []]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def _has(items: Any, value: str, wildcard: str = "*") -> bool:
    return any(item in (wildcard, value) for item in items or ())


def rule_allows(attrs: Attributes, rule: Rule) -> bool:
    """``RuleAllows``: one PolicyRule against one request."""
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        for url in rule.get("nonResourceURLs") or ():
            if url in ("*", attrs.path) or (url.endswith("*") and attrs.path.startswith(url.rstrip("*"))):
                return True
        return False
    if not _has(rule.get("apiGroups"), attrs.group):
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources") or ()
    if not any(
        r in ("*", combined) or (attrs.subresource and r == f"*/{attrs.subresource}") for r in resources
    ):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _applies(
    user: Mapping[str, Any], subjects: Sequence[Mapping[str, Any]], namespace: str
) -> Mapping[str, Any] | None:
    username = str(user.get("username") or "")
    groups = user.get("groups") or ()
    for subject in subjects or ():
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == username:
            return subject
        if kind == "Group" and name in groups:
            return subject
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or namespace
            if ns and username == f"system:serviceaccount:{ns}:{name}":
                return subject
    return None


def _describe(subject: Mapping[str, Any], namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("name")}/{subject.get("namespace") or namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


@dataclass
class _Policy:
    """The four RBAC collections as the authorizer's informers hold them."""

    roles: dict[tuple[str, str], dict[str, Any]]
    role_bindings: dict[str, list[dict[str, Any]]]
    cluster_roles: dict[str, dict[str, Any]]
    cluster_role_bindings: list[dict[str, Any]]


class Authorizer:
    """``system:masters``, then RBAC, over the objects of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._policy: _Policy | None = None
        self._generation = 0  # bumped by every RBAC write
        store.subscribe(self._changed, PLURALS)

    def _changed(self, event_type: str, resource: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._policy = None
            self._generation += 1

    def _current(self) -> _Policy:
        with self._lock:
            policy, generation = self._policy, self._generation
        if policy is not None:
            return policy
        policy = _Policy({}, {}, {}, [])
        for role in self.store.list("roles")[0]:
            meta = role["metadata"]
            policy.roles[(meta["namespace"], meta["name"])] = role
        for binding in self.store.list("rolebindings")[0]:
            policy.role_bindings.setdefault(binding["metadata"]["namespace"], []).append(binding)
        for role in self.store.list("clusterroles")[0]:
            policy.cluster_roles[role["metadata"]["name"]] = role
        policy.cluster_role_bindings = self.store.list("clusterrolebindings")[0]
        with self._lock:
            if self._generation == generation:  # else a write came meanwhile: rebuild next time
                self._policy = policy
        return policy

    def _rules(self, policy: _Policy, ref: Mapping[str, Any], namespace: str) -> tuple[list[Rule], str]:
        kind, name = ref.get("kind"), str(ref.get("name") or "")
        if kind == "Role":
            role = policy.roles.get((namespace, name))
            if role is None:
                return [], f'role.rbac.authorization.k8s.io "{name}" not found'
        elif kind == "ClusterRole":
            role = policy.cluster_roles.get(name)
            if role is None:
                return [], f'clusterrole.rbac.authorization.k8s.io "{name}" not found'
        else:
            return [], f'unsupported role reference kind: "{kind}"'
        return list(role.get("rules") or []), ""

    def visit(self, user: Mapping[str, Any], namespace: str) -> Iterator[tuple[str, Rule | None, str]]:
        """``VisitRulesFor``: (source, rule, error) for every rule that applies to ``user``
        in ``namespace`` (cluster-wide bindings first)."""
        policy = self._current()
        yield from self._visit(policy, user, policy.cluster_role_bindings, "")
        if namespace:
            yield from self._visit(policy, user, policy.role_bindings.get(namespace, []), namespace)

    def _visit(
        self, policy: _Policy, user: Mapping[str, Any], bindings: list[dict[str, Any]], namespace: str
    ) -> Iterator[tuple[str, Rule | None, str]]:
        """The rules of ``bindings`` (a namespace's RoleBindings, or with ``namespace`` empty
        the ClusterRoleBindings) that apply to ``user``, described as upstream describes them."""
        for binding in bindings:
            subject = _applies(user, binding.get("subjects") or [], namespace)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            rules, error = self._rules(policy, ref, namespace)
            if error:
                yield "", None, error
                continue
            name = binding["metadata"]["name"]
            kind = f'RoleBinding "{name}/{namespace}"' if namespace else f'ClusterRoleBinding "{name}"'
            source = f'{kind} of {ref.get("kind")} "{ref.get("name")}" to {_describe(subject, namespace)}'
            for rule in rules:
                yield source, rule, ""

    def authorize(self, attrs: Attributes) -> Decision:
        if MASTERS in attrs.groups:
            return Decision(True)
        found: list[str] = []
        for source, rule, error in self.visit(attrs.user, attrs.namespace):
            if rule is not None and rule_allows(attrs, rule):
                return Decision(True, f"RBAC: allowed by {source}")
            if error:
                found.append(error)
        if not found:
            return Decision(False)
        # utilerrors.NewAggregate: one error as itself, several as "[a, b]"
        return Decision(False, "RBAC: " + (found[0] if len(found) == 1 else f"[{', '.join(found)}]"))

    def rules_for(self, user: Mapping[str, Any], namespace: str) -> tuple[list[Rule], list[str]]:
        """Every rule that applies (``RulesFor``) and the resolution errors; ``system:masters``
        first holds the privileged-group authorizer's ``*`` rules."""
        rules: list[Rule] = []
        errors: list[str] = []
        if MASTERS in (user.get("groups") or ()):
            rules += [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                      {"verbs": ["*"], "nonResourceURLs": ["*"]}]
        for _, rule, error in self.visit(user, namespace):
            if rule is not None:
                rules.append(rule)
            if error:
                errors.append(error)
        return rules, errors


def forbidden_message(attrs: Attributes, reason: str = "") -> tuple[str, dict[str, str]]:
    """The 403 Status's message and details, as ``responsewriters.Forbidden`` and
    ``apierrors.NewForbidden`` write them
    (``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go``,
    ``staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go``)."""
    user = attrs.username
    if not attrs.resource_request:
        text = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        text = f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    if reason:
        text = f"{text}: {reason}"
    qualified = attrs.resource + (f".{attrs.group}" if attrs.group and attrs.resource else "")
    if not attrs.resource_request or not attrs.resource:
        message = f"forbidden: {text}"
    elif attrs.name:
        message = f'{qualified} "{attrs.name}" is forbidden: {text}'
    else:
        message = f"{qualified} is forbidden: {text}"
    details = {k: v for k, v in (("name", attrs.name), ("group", attrs.group), ("kind", attrs.resource)) if v}
    return message, details
