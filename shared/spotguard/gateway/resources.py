"""The Kubernetes resources spotguard talks to, and how their REST paths are built.

A :class:`Resource` names one API resource (group, version, plural, kind and
whether it is namespaced); :meth:`Resource.path` builds its URL path exactly
as kube-apiserver serves it::

    /api/v1/namespaces/{ns}/pods/{name}/eviction
    /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale
    /apis/coordination.k8s.io/v1/namespaces/{ns}/leases
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``apps/v1`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """The name used in logs and request counts: ``pods``, ``deployments.apps``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path; ``namespace=None`` on a namespaced resource lists across all namespaces."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped; got namespace {namespace!r}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError(f"empty {self.kind} name")
            parts.append(_segment(name))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs a name")
        return "/".join(parts)


def _segment(text: str) -> str:
    return quote(text, safe="")


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
EVENTS = Resource("", "v1", "events", "Event", True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
SERVICES = Resource("", "v1", "services", "Service", True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet", True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet", True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
PODDISRUPTIONBUDGETS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True)
MUTATINGWEBHOOKCONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    False,
)
# Karpenter's NodePools (a CRD: absent where Karpenter is not installed, answered 404)
NODEPOOLS = Resource("karpenter.sh", "v1", "nodepools", "NodePool", False)

ALL: tuple[Resource, ...] = (
    PODS,
    NODES,
    NAMESPACES,
    EVENTS,
    CONFIGMAPS,
    SERVICES,
    DEPLOYMENTS,
    REPLICASETS,
    STATEFULSETS,
    DAEMONSETS,
    LEASES,
    PODDISRUPTIONBUDGETS,
    HPAS,
    MUTATINGWEBHOOKCONFIGURATIONS,
)

_BY_KIND: dict[tuple[str, str], Resource] = {(r.group, r.kind): r for r in ALL}


def for_kind(api_version: str, kind: str) -> Resource | None:
    """The resource for an object's ``apiVersion`` and ``kind`` (an ownerReference's, say).

    The group decides; any version of a known group/kind maps to the version spotguard uses.
    """
    group = api_version.rpartition("/")[0]
    return _BY_KIND.get((group, kind))
