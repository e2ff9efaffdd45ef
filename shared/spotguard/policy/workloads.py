"""The policy's view of a workload: a Deployment or StatefulSet."""

from __future__ import annotations

import enum
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
# the Deployment it surges; the copy is named SURGE_COPY_PREFIX + that name.
SURGE_OF = "spotguard.io/surge-of"
SURGE_COPY_PREFIX = "spotguard-surge-"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


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
