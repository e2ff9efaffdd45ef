"""A workload as the plans see it: the object, its floor, and its live pods."""

from __future__ import annotations

from dataclasses import dataclass

from spotguard.policy.floors import Floor
from spotguard.policy.views import PodView
from spotguard.policy.workloads import Workload


@dataclass(frozen=True)
class WorkloadState:
    """One Deployment or StatefulSet with its floor and the pods that count against it.

    The adapter groups pods by controller (Deployment -> ReplicaSet -> Pod,
    StatefulSet -> Pod); ``pods`` may include finished and terminating pods,
    the plans skip them.
    """

    workload: Workload
    floor: Floor
    pods: tuple[PodView, ...] = ()
    # A surge copy of spotguard's serves it (spotguard.policy.surgecopy): its surge is in
    # progress, whatever its own annotations say (a replace may have taken the record).
    surge_copy: bool = False

    @property
    def key(self) -> str:
        return self.workload.key
