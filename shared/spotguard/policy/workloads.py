"""The policy's view of a workload: a Deployment or StatefulSet."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANNOTATION_PREFIX = "spotguard.io/"
MIN_ON_DEMAND = "spotguard.io/min-on-demand"
ENABLED = "spotguard.io/enabled"
PLACEMENT_LABEL = "spotguard.io/placement"
SURGE = "spotguard.io/surge"
# On a pod: admitted as one of a surge's extra on-demand replicas (no deletion cost; the
# scale back removes these first after the dead pods).
SURGE_REPLICA = "spotguard.io/surge-replica"
# On a pod: admitted as a new replica of a move to spot with a required spot node affinity
# (policy.moves.launching_move); the value names the move (policy.moves.move_id). The node-added
# reconcile takes such a pod that is still Pending once that move is no longer under way
# (policy.moves.stranded): a user's own spot requirement never carries it.
MOVE_REQUIRES_SPOT = "spotguard.io/move-requires-spot"
# On a surge replica while its surge is needed: the node autoscalers must not move it
# (Karpenter's consolidation; the Cluster Autoscaler's scale-down). Set by admission where
# the pod does not carry the key already; SURGE_PROTECTED lists the keys spotguard set, which
# the surge's finish removes from the replicas that stay.
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
SURGE_PROTECTION = {DO_NOT_DISRUPT: "true", SAFE_TO_EVICT: "false"}
SURGE_PROTECTED = "spotguard.io/surge-protected"
# On a StatefulSet's pod when every one of its replicas is its floor (policy.floors.
# every_pod_is_floor): the same protection, for good (no drain can take such a pod without
# breaking the floor: it cannot be replaced before it is gone); lists the keys spotguard set.
FLOOR_PROTECTED = "spotguard.io/floor-protected"
INTERRUPTION_TAINT = "spotguard.io/interruption"
# On a surge copy (spotguard.policy.surgecopy), in its selector and on its pods: the name of
# the Deployment it surges (surge_of_label: a digest stands in beyond a label value's 63
# characters); the copy is named surge_copy_name(that name). SURGE_FOR, on the copy and its
# pods: "Deployment/<the whole name>".
SURGE_OF = "spotguard.io/surge-of"
SURGE_FOR = "spotguard.io/surge-for"
SURGE_COPY_PREFIX = "spotguard-surge-"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# apimachinery pkg/util/validation: a label value (IsValidLabelValue) and an object name
# (IsDNS1123Subdomain, ValidateObjectMeta) at most.
LABEL_VALUE_MAX = 63
NAME_MAX = 253
_DIGEST = 10


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:_DIGEST]


def surge_of_label(deployment: str) -> str:
    """The :data:`SURGE_OF` value of ``deployment``'s copy: its name; past a label value's 63
    characters, its first 52 and a digest of the whole (a Deployment's name may have 253: the
    API refuses a longer label value, and so the copy)."""
    if len(deployment) <= LABEL_VALUE_MAX:
        return deployment
    return f"{deployment[: LABEL_VALUE_MAX - _DIGEST - 1]}-{_digest(deployment)}"


def surge_copy_name(deployment: str) -> str:
    """The name of ``deployment``'s surge copy: the prefix and its name; where that is over an
    object name's 253 characters, cut with a digest of the whole name (two long names that
    begin alike get two copies)."""
    name = SURGE_COPY_PREFIX + deployment
    if len(name) <= NAME_MAX:
        return name
    return f"{name[: NAME_MAX - _DIGEST - 1]}-{_digest(deployment)}"


def surge_deployment(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """The name of the Deployment a surge copy, or a pod of one, surges (from its
    :data:`SURGE_OF` label; the whole name from :data:`SURGE_FOR` where the label holds a
    digest), or None for any other object."""
    label = labels.get(SURGE_OF)
    if not label:
        return None
    whole = str(annotations.get(SURGE_FOR) or "")
    if whole.startswith(f"{Kind.DEPLOYMENT}/") and surge_of_label(name := whole.split("/", 1)[1]) == label:
        return name
    return label


class Kind(enum.StrEnum):
    DEPLOYMENT = "Deployment"
    STATEFULSET = "StatefulSet"


@dataclass(frozen=True)
class Workload:
    kind: Kind
    namespace: str
    name: str
    replicas: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""
    selector: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0  # metadata.generation: goes up with every change of the spec

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Workload:
        """From a Deployment or StatefulSet object as the API returns it."""
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        replicas = spec.get("replicas")
        return cls(
            kind=Kind(raw.get("kind", "Deployment")),
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            replicas=1 if replicas is None else int(replicas),
            annotations=dict(meta.get("annotations") or {}),
            uid=str(meta.get("uid", "")),
            selector=dict((spec.get("selector") or {}).get("matchLabels") or {}),
            generation=int(meta.get("generation") or 0),
        )
