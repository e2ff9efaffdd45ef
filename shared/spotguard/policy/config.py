"""Cluster-wide configuration, read from environment variables or a ConfigMap.

Every setting has a sensible default. Reading never raises: an invalid value is
reported as a :class:`~spotguard.policy.validation.Problem` and the default
applies. Environment variables are ``SPOTGUARD_<NAME>``; the same settings in a
ConfigMap use the key ``<name>`` in lower case with dashes (``excluded-namespaces``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spotguard.policy import capacity, floors, tolerations
from spotguard.policy.capacity import Capacity, LabelScheme
from spotguard.policy.tolerations import Toleration
from spotguard.policy.validation import Problem

ENV_PREFIX = "SPOTGUARD_"


class RebalanceAction(enum.StrEnum):
    """What an EC2 rebalance recommendation does (it never drains)."""

    IGNORE = "ignore"
    TAINT = "taint"
    SURGE = "surge"


class Launchable(enum.StrEnum):
    """Whether on-demand capacity can be launched when no on-demand node exists (an
    on-demand floor then waits for the node autoscaler instead of going to spot)."""

    AUTO = "auto"  # Karpenter NodePools decide where they can be read; else the existing nodes
    TRUE = "true"  # a node autoscaler (a Cluster Autoscaler on-demand group) can launch it
    FALSE = "false"  # only the existing nodes decide


class HeadroomCover(enum.StrEnum):
    """What node-added's on-demand headroom covers (spotguard.policy.headroom): nothing, the
    surge of the spot node that needs the most, or the surge of every spot node at once."""

    OFF = "off"
    LARGEST_NODE = "largest-node"
    ALL_SPOT = "all-spot"


HEADROOM_IMAGE = "registry.k8s.io/pause:3.10"
HEADROOM_MAX_PODS = 10


@dataclass(frozen=True)
class Config:
    label_schemes: tuple[LabelScheme, ...] = capacity.DEFAULT_SCHEMES
    # Deprecated and ignored: the admission patch's on-demand requirement is "not
    # spot under any scheme" and its spot preference covers every scheme, so no
    # single label key has to be chosen. Still accepted so old settings stay valid.
    affinity_label: str = ""
    excluded_namespaces: frozenset[str] = frozenset(
        {"kube-system", "kube-public", "kube-node-lease", "spotguard"}
    )
    # None: the defaults table of DESIGN.md; otherwise a cluster-wide floor.
    default_min_on_demand: floors.FloorSpec | None = None
    # Tolerations added to spot pods: the taints providers put on spot pools
    # (AKS always; GKE where the pool is created with it). Tolerating a taint no
    # node carries changes nothing, so the default is safe on every provider.
    spot_tolerations: tuple[Toleration, ...] = (
        Toleration("kubernetes.azure.com/scalesetpriority", "Equal", "spot", "NoSchedule"),
        Toleration("cloud.google.com/gke-spot", "Equal", "true", "NoSchedule"),
        Toleration("cloud.google.com/gke-preemptible", "Equal", "true", "NoSchedule"),
    )
    # How pods on nodes with no recognised capacity label count.
    unknown_capacity: Capacity = Capacity.ON_DEMAND
    rebalance_action: RebalanceAction = RebalanceAction.TAINT
    spread_topology_keys: tuple[str, ...] = (
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    )
    spot_preference_weight: int = 100
    # The deletion cost of replica number 0 (policy.ranks): replica n costs this minus n.
    on_demand_deletion_cost: int = 1_000_000
    reservation_ttl_seconds: int = 30
    # node-added's moves back to spot, batched like a rolling update: a pass starts moves
    # for at most this many workloads, each of at most this many pods (never more than the
    # workload has above its floor, nor more than its PodDisruptionBudget allows), and no
    # more pods than ``rebalance_max_in_flight`` are being moved across the cluster at once.
    rebalance_max_workloads_per_step: int = 200
    rebalance_max_pods_per_workload: int = 10
    rebalance_max_in_flight: int = 4000
    # node-added: a move whose new replica is not Ready by then is undone; after a
    # move that made no progress the workload is left alone this long.
    rebalance_move_timeout_seconds: int = 300
    rebalance_hold_seconds: int = 600
    # A workload whose newest pod is younger than this is left alone: the admission
    # webhook's own count of it may still be settling.
    rebalance_settle_seconds: int = 30
    # A surge made for a rebalance recommendation alone (rebalance_action surge) ends
    # after this long, and the taint of a rebalance never followed by an interruption
    # is removed after it.
    rebalance_surge_seconds: int = 600
    # spotguard drains the doomed nodes itself: it evicts a doomed pod once its
    # replacement is Ready elsewhere (create before evict), before the reclaim time.
    drain: bool = False
    # Surge with a spotguard-owned copy of the Deployment (policy.surgecopy) instead of its
    # spec.replicas, which other writers own (GitOps self-heal, kubectl replace, helm --force,
    # the HPA: issue 24). The default; false surges spec.replicas as before. Every process
    # that handles interruptions (spot-interruption, node-added) must agree; admission
    # reads the record's own "copy" mark.
    surge_copy: bool = True
    # admission: whether an on-demand floor may wait for a node to be launched
    on_demand_launchable: Launchable = Launchable.AUTO
    # node-added: on-demand room held by low-priority placeholder pods for the surge of the
    # workloads at risk (policy.headroom): off (the default: it is billed while idle),
    # largest-node or all-spot; never more placeholders than headroom_max_pods.
    headroom: HeadroomCover = HeadroomCover.OFF
    headroom_max_pods: int = HEADROOM_MAX_PODS
    headroom_image: str = HEADROOM_IMAGE

    def node_capacity(self, labels: Mapping[str, str]) -> Capacity:
        """The capacity a pod on a node with these labels counts as."""
        found = capacity.classify(labels, self.label_schemes)
        return self.unknown_capacity if found is Capacity.UNKNOWN else found


def _words(text: str) -> frozenset[str]:
    return frozenset(w.strip() for w in text.split(",") if w.strip())


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off", ""):
        return False
    raise ValueError("must be true or false")


def _launchable(text: str) -> Launchable:
    value = text.strip().lower()
    if value in ("auto", ""):
        return Launchable.AUTO
    try:
        return Launchable.TRUE if _boolean(value) else Launchable.FALSE
    except ValueError:
        raise ValueError("must be auto, true or false") from None


def _cover(text: str) -> HeadroomCover:
    value = text.strip().lower()
    try:
        return HeadroomCover(value or "off")
    except ValueError:
        raise ValueError("must be off, largest-node or all-spot") from None


def _image(text: str) -> str:
    value = text.strip()
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be an image reference")
    return value


def _floor_spec(text: str) -> floors.FloorSpec:
    spec = floors.parse_min_on_demand(text)
    if isinstance(spec, Problem):
        raise ValueError(spec.message)
    return spec


def _capacity(text: str) -> Capacity:
    value = Capacity(text.strip())
    if value is Capacity.UNKNOWN:
        raise ValueError("must be spot or on-demand")
    return value


_PARSERS: dict[str, Callable[[str], Any]] = {
    "label_schemes": capacity.parse_schemes,
    "affinity_label": lambda s: s.strip(),
    "excluded_namespaces": _words,
    "default_min_on_demand": _floor_spec,
    "spot_tolerations": lambda s: tuple(
        tolerations.parse_toleration(t) for t in s.split(",") if t.strip()
    ),
    "unknown_capacity": _capacity,
    "rebalance_action": lambda s: RebalanceAction(s.strip().lower()),
    "spread_topology_keys": lambda s: tuple(k.strip() for k in s.split(",") if k.strip()),
    "spot_preference_weight": lambda s: min(100, max(1, int(s))),
    "on_demand_deletion_cost": int,
    "reservation_ttl_seconds": _positive_int,
    "rebalance_max_workloads_per_step": _positive_int,
    "rebalance_max_pods_per_workload": _positive_int,
    "rebalance_max_in_flight": _positive_int,
    "rebalance_move_timeout_seconds": _positive_int,
    "rebalance_hold_seconds": _positive_int,
    "rebalance_settle_seconds": _positive_int,
    "rebalance_surge_seconds": _positive_int,
    "drain": _boolean,
    "surge_copy": _boolean,
    "on_demand_launchable": _launchable,
    "headroom": _cover,
    "headroom_max_pods": _positive_int,
    "headroom_image": _image,
}


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def configmap_key(field: str) -> str:
    return field.replace("_", "-")


def from_settings(
    settings: Mapping[str, str], base: Config | None = None
) -> tuple[Config, list[Problem]]:
    """Build a Config from settings keyed by field name; unknown keys are ignored."""
    config = base or Config()
    changes: dict[str, Any] = {}
    problems: list[Problem] = []
    for field, parse in _PARSERS.items():
        if field not in settings:
            continue
        raw = settings[field]
        try:
            changes[field] = parse(raw)
        except (ValueError, KeyError) as exc:
            problems.append(Problem(field, raw, f"{exc}; using the default"))
    return dataclasses.replace(config, **changes), problems


def from_env(env: Mapping[str, str], base: Config | None = None) -> tuple[Config, list[Problem]]:
    settings = {f: env[env_name(f)] for f in _PARSERS if env_name(f) in env}
    return from_settings(settings, base)


def from_configmap(
    data: Mapping[str, str], base: Config | None = None
) -> tuple[Config, list[Problem]]:
    settings = {f: data[configmap_key(f)] for f in _PARSERS if configmap_key(f) in data}
    return from_settings(settings, base)


SETTINGS = tuple(_PARSERS)
