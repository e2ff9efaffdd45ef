"""The resource types the simulated API server serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # DELETE without propagationPolicy orphans the dependents (batch/v1 Jobs and v1
    # ReplicationControllers keep this legacy default: pkg/registry/*/strategy.go
    # DefaultGarbageCollectionPolicy)
    orphan_by_default: bool = False
    # the verbs served, when not every one (the access reviews are create-only)
    verbs: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def prefix(self) -> str:
        """URL prefix of the group version: ``/api/v1`` or ``/apis/apps/v1``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


_ALL = ("all",)
_KARPENTER = ("karpenter",)
RBAC = "rbac.authorization.k8s.io"
TYPES: tuple[ResourceType, ...] = (
    ResourceType("namespaces", "Namespace", "", "v1", False, ("ns",), ("status",)),
    ResourceType("nodes", "Node", "", "v1", False, ("no",), ("status",)),
    ResourceType(
        "pods", "Pod", "", "v1", True, ("po",), ("status", "eviction", "binding"), _ALL
    ),
    ResourceType("events", "Event", "", "v1", True, ("ev",)),
    ResourceType("configmaps", "ConfigMap", "", "v1", True, ("cm",)),
    ResourceType("services", "Service", "", "v1", True, ("svc",), ("status",), _ALL),
    ResourceType("serviceaccounts", "ServiceAccount", "", "v1", True, ("sa",), ("token",)),
    ResourceType("secrets", "Secret", "", "v1", True),
    ResourceType("resourcequotas", "ResourceQuota", "", "v1", True, ("quota",), ("status",)),
    ResourceType("limitranges", "LimitRange", "", "v1", True, ("limits",)),
    ResourceType(
        "deployments", "Deployment", "apps", "v1", True, ("deploy",), ("status", "scale"), _ALL
    ),
    ResourceType(
        "replicasets", "ReplicaSet", "apps", "v1", True, ("rs",), ("status", "scale"), _ALL
    ),
    ResourceType(
        "statefulsets", "StatefulSet", "apps", "v1", True, ("sts",), ("status", "scale"), _ALL
    ),
    ResourceType(
        "replicationcontrollers", "ReplicationController", "", "v1", True, ("rc",),
        ("status", "scale"), _ALL, orphan_by_default=True,
    ),
    ResourceType("daemonsets", "DaemonSet", "apps", "v1", True, ("ds",), ("status",), _ALL),
    ResourceType("controllerrevisions", "ControllerRevision", "apps", "v1", True),
    ResourceType("jobs", "Job", "batch", "v1", True, (), ("status",), _ALL, orphan_by_default=True),
    ResourceType("cronjobs", "CronJob", "batch", "v1", True, ("cj",), ("status",), _ALL),
    ResourceType("priorityclasses", "PriorityClass", "scheduling.k8s.io", "v1", False, ("pc",)),
    ResourceType("leases", "Lease", "coordination.k8s.io", "v1", True),
    ResourceType(
        "poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True, ("pdb",), ("status",)
    ),
    ResourceType(
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        "autoscaling",
        "v2",
        True,
        ("hpa",),
        ("status",),
        _ALL,
    ),
    ResourceType("roles", "Role", RBAC, "v1", True),
    ResourceType("rolebindings", "RoleBinding", RBAC, "v1", True),
    ResourceType("clusterroles", "ClusterRole", RBAC, "v1", False),
    ResourceType("clusterrolebindings", "ClusterRoleBinding", RBAC, "v1", False),
    ResourceType(
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        "admissionregistration.k8s.io",
        "v1",
        False,
    ),
    ResourceType(
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io",
        "v1",
        False,
    ),
    # kube-aggregator's registry (pkg/registry/apiservice/etcd): category api-extensions
    ResourceType("apiservices", "APIService", "apiregistration.k8s.io", "v1", False, (), ("status",),
                 ("api-extensions",)),
    # Karpenter's custom resources, as its CRDs declare them (kubernetes-sigs/karpenter
    # pkg/apis/crds/karpenter.sh_*.yaml, aws/karpenter-provider-aws
    # pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml): cluster-scoped, with status.
    ResourceType("nodepools", "NodePool", "karpenter.sh", "v1", False, (), ("status",), _KARPENTER),
    ResourceType("nodeclaims", "NodeClaim", "karpenter.sh", "v1", False, (), ("status",), _KARPENTER),
    ResourceType("ec2nodeclasses", "EC2NodeClass", "karpenter.k8s.aws", "v1", False, ("ec2nc", "ec2ncs"),
                 ("status",), _KARPENTER),
)

# Served without storage of their own: events.k8s.io/v1 Events are the core/v1 Events
# of the store under another schema (``spotguard_sim.eventsapi``), as kube-apiserver
# serves one Event storage through both group versions.
EVENTS_V1 = ResourceType("events", "Event", "events.k8s.io", "v1", True, ("ev",))
# Access reviews: created, answered, never stored (spotguard_sim.accessreviews).
_CREATE = ("create",)
_AUTHZ = "authorization.k8s.io"
REVIEWS: tuple[ResourceType, ...] = (
    ResourceType("selfsubjectaccessreviews", "SelfSubjectAccessReview", _AUTHZ, "v1", False, verbs=_CREATE),
    ResourceType("selfsubjectrulesreviews", "SelfSubjectRulesReview", _AUTHZ, "v1", False, verbs=_CREATE),
    ResourceType("subjectaccessreviews", "SubjectAccessReview", _AUTHZ, "v1", False, verbs=_CREATE),
    ResourceType("localsubjectaccessreviews", "LocalSubjectAccessReview", _AUTHZ, "v1", True, verbs=_CREATE),
    ResourceType("selfsubjectreviews", "SelfSubjectReview", "authentication.k8s.io", "v1", False, verbs=_CREATE),
)
VIEWS: tuple[ResourceType, ...] = (EVENTS_V1, *REVIEWS)
SERVED: tuple[ResourceType, ...] = TYPES + VIEWS
PLURALS: frozenset[str] = frozenset(t.plural for t in SERVED)

# The kind a subresource's requests and responses carry when it is not the parent's own
# (``status`` is): discovery, the OpenAPI documents and AdmissionReviews name it.
SUBRESOURCE_KINDS: dict[str, tuple[str, str, str]] = {
    "scale": ("autoscaling", "v1", "Scale"),
    "eviction": ("policy", "v1", "Eviction"),
    "binding": ("", "v1", "Binding"),
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
}

BY_PLURAL: dict[str, ResourceType] = {t.plural: t for t in TYPES}
BY_KIND: dict[str, ResourceType] = {t.kind: t for t in TYPES}


def get(plural: str) -> ResourceType:
    from spotguard_sim import errors

    try:
        return BY_PLURAL[plural]
    except KeyError:
        raise errors.NotFound(f"the server could not find the requested resource ({plural})") from None


def group_versions() -> list[tuple[str, str]]:
    """(group, version) pairs in a stable order, core first."""
    seen: list[tuple[str, str]] = []
    for t in SERVED:
        if (t.group, t.version) not in seen:
            seen.append((t.group, t.version))
    return seen
