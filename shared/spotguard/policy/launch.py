"""Spot capacity that can be launched: the Karpenter NodePools that may start a spot node for a pod.

On a cluster whose nodes Karpenter launches there is no idle spot room to move a
replica into: a move creates the new replica as a spot pod and the provisioner
launches a node for it. node-added reads the NodePools (``karpenter.sh/v1``) and
plans such a move only where one of them can launch spot for the pod:

- its requirements allow the ``karpenter.sh/capacity-type`` ``spot``. Karpenter
  treats a NodePool without that requirement as on-demand only ("If not
  specified, defaults to on-demand", kubernetes-sigs/karpenter
  ``pkg/apis/v1/nodepool.go`` / docs concepts/nodepools.md);
- the pod (with the spot tolerations the admission patch adds) tolerates the
  pool's ``NoSchedule``/``NoExecute`` template taints (startup taints are
  removed once the node is up, as Karpenter does, and are not checked);
- the pool's template labels and requirements do not contradict the pod's
  ``nodeSelector`` (the keys the pod selects on that the pool fixes).

What Karpenter knows and the cluster does not (an offering refused for
insufficient capacity, a pool at its ``limits``) is not known here: a move whose
launch never comes is undone after ``rebalance_move_timeout_seconds``
(:mod:`spotguard.policy.moves`), and the workload held.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import fit
from spotguard.policy.tolerations import Taint, Toleration, untolerated
from spotguard.policy.views import PodView

CAPACITY_TYPE = "karpenter.sh/capacity-type"
SPOT = "spot"


@dataclass(frozen=True)
class NodePool:
    """What of a NodePool decides whether it can launch spot for a pod."""

    name: str
    requirements: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] | None = None
    taints: tuple[Taint, ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NodePool:
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        tspec = template.get("spec") or {}
        return cls(
            name=str((obj.get("metadata") or {}).get("name") or ""),
            requirements=tuple(r for r in tspec.get("requirements") or [] if isinstance(r, Mapping)),
            labels={str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()},
            taints=tuple(Taint.from_json(t) for t in tspec.get("taints") or [] if isinstance(t, Mapping)),
        )

    def allows(self, key: str, value: str) -> bool:
        """Its requirements (ANDed) and template labels allow a node labelled ``key=value``."""
        if self.labels and key in self.labels and self.labels[key] != value:
            return False
        return all(fit.match_requirement(r, {key: value}) for r in self.requirements if r.get("key") == key)

    @property
    def launches_spot(self) -> bool:
        if not any(r.get("key") == CAPACITY_TYPE for r in self.requirements):
            return bool(self.labels) and (self.labels or {}).get(CAPACITY_TYPE) == SPOT
        return self.allows(CAPACITY_TYPE, SPOT)


def spot_pool_for(pod: PodView, pools: Iterable[NodePool], tolerations: Sequence[Toleration]) -> str | None:
    """The name of a NodePool that can launch a spot node for ``pod`` (with ``tolerations``
    added, the spot slot's), or None."""
    tols = [*pod.tolerations, *tolerations]
    for pool in sorted(pools, key=lambda p: p.name):
        if not pool.launches_spot:
            continue
        if untolerated(pool.taints, tols, ("NoSchedule", "NoExecute")):
            continue
        if not all(pool.allows(k, v) for k, v in pod.node_selector.items() if k != CAPACITY_TYPE):
            continue
        return pool.name
    return None
