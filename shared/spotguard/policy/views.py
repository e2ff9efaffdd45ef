"""The policy's small views of pods and nodes, built from API objects (plain dicts)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spotguard.policy import quantities
from spotguard.policy.tolerations import Taint, Toleration
from spotguard.policy.workloads import PLACEMENT_LABEL

_ORDINAL = re.compile(r"-(\d+)$")


def epoch(text: Any) -> float:
    """An RFC 3339 time (``2026-11-26T01:02:03Z``) as epoch seconds; 0.0 when absent or unreadable."""
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    provider_id: str = ""

    @property
    def instance_id(self) -> str:
        """The EC2 instance id from ``aws:///<zone>/<instance-id>``, or ''."""
        if not self.provider_id.startswith("aws://"):
            return ""
        return self.provider_id.rsplit("/", 1)[-1]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> NodeView:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        conditions = status.get("conditions") or []
        ready = (
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            or not conditions
        )
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            taints=tuple(Taint.from_json(t) for t in spec.get("taints") or []),
            # Allocatable defaults to capacity where the kubelet has not reported it.
            allocatable=quantities.parse_resources(
                status.get("allocatable") or status.get("capacity")
            ),
            unschedulable=bool(spec.get("unschedulable")),
            ready=ready,
            provider_id=str(spec.get("providerID") or ""),
        )


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner: Owner | None = None
    node_name: str = ""
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    requests: Mapping[str, int] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Mapping[str, Any], ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict)
    # True where the pod has a required node affinity at all, even one with an
    # empty ``nodeSelectorTerms`` list (which matches no node). Non-empty
    # ``required_terms`` imply it.
    required_affinity: bool = False
    creation_timestamp: str = ""  # metadata.creationTimestamp, as the API server wrote it
    # Since when the scheduler has found no room for the pod (its PodScheduled condition False,
    # reason Unschedulable: that condition's lastTransitionTime), epoch seconds; 0.0 otherwise.
    unschedulable_since: float = 0.0

    @property
    def has_required_affinity(self) -> bool:
        return self.required_affinity or bool(self.required_terms)

    @property
    def created(self) -> float:
        """When the API server created the pod (its clock), epoch seconds; 0.0 when unknown."""
        return epoch(self.creation_timestamp)

    @property
    def placement_label(self) -> str | None:
        return self.labels.get(PLACEMENT_LABEL)

    @property
    def ordinal(self) -> int | None:
        """A StatefulSet pod's ordinal, from its name."""
        if "apps.kubernetes.io/pod-index" in self.labels:
            try:
                return int(self.labels["apps.kubernetes.io/pod-index"])
            except ValueError:
                pass
        m = _ORDINAL.search(self.name)
        return int(m.group(1)) if m else None

    @property
    def active(self) -> bool:
        """Counts towards a workload: not terminating and not finished."""
        return not self.terminating and self.phase not in ("Succeeded", "Failed")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, scheduling: bool = True) -> PodView:
        """From a Pod as the API returns it.

        ``scheduling=False`` leaves out what only placement and fit read (requests,
        tolerations, node selector, affinity, the spec): a plan over 20,000 pods
        reads none of it.
        """
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        owner = None
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                owner = Owner(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
                break
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        unschedulable = next(
            (
                c
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        view = cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            owner=owner,
            node_name=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or "Pending"),
            ready=ready,
            terminating=bool(meta.get("deletionTimestamp")),
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            unschedulable_since=0.0 if unschedulable is None else epoch(unschedulable.get("lastTransitionTime")),
        )
        if not scheduling:
            return view
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        return dataclasses.replace(
            view,
            requests=quantities.pod_requests(spec),
            tolerations=tuple(Toleration.from_json(t) for t in spec.get("tolerations") or []),
            node_selector=dict(spec.get("nodeSelector") or {}),
            required_terms=tuple(affinity.get("nodeSelectorTerms") or ()),
            spec=spec,
            required_affinity="nodeSelectorTerms" in affinity,
        )
