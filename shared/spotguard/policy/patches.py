"""The admission patch: an RFC 6902 JSONPatch that applies a placement to a pod.

It merges with the user's own affinity, tolerations and topology spread and
never replaces them: the on-demand requirement is ANDed into every existing
nodeSelectorTerm. Applying the patch to a pod that already carries the
placement yields an empty patch (reinvocation is a no-op).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotguard.policy import capacity
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.placement import Placement
from spotguard.policy.tolerations import Toleration
from spotguard.policy.workloads import (
    DELETION_COST,
    FLOOR_PROTECTED,
    MOVE_REQUIRES_SPOT,
    PLACEMENT_LABEL,
    SURGE_PROTECTED,
    SURGE_PROTECTION,
    SURGE_REPLICA,
)

Op = dict[str, Any]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# Labels that differ between pods of one workload: never part of a spread selector.
VOLATILE_LABELS = frozenset(
    {
        "pod-template-hash",
        "controller-revision-hash",
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
        PLACEMENT_LABEL,
    }
)


def escape(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(t)) for t in tokens)


def not_spot_expressions(config: Config) -> list[dict[str, Any]]:
    """ "Not spot under any scheme": one ``NotIn`` per label key, ANDed.

    ``NotIn`` also matches a node that does not carry the key, so on-demand
    nodes of every scheme, and pools with no capacity label at all (GKE
    standard, AKS regular), match it; a node spot under any scheme does not.
    """
    return [
        {"key": key, "operator": "NotIn", "values": sorted(values)}
        for key, values in sorted(capacity.spot_values(config.label_schemes).items())
    ]


def on_demand_terms(config: Config) -> list[list[dict[str, Any]]]:
    """The on-demand requirement as ORed lists of ANDed expressions.

    A node matches it exactly when ``config.node_capacity(labels)`` is on-demand:
    with unknown capacity counting as on-demand (the default) that is one list,
    "not spot under any scheme"; with unknown capacity counting as spot, a node
    must also be on-demand under some scheme (one list per such key).
    """
    not_spot = not_spot_expressions(config)
    if config.unknown_capacity is not Capacity.SPOT:
        return [not_spot]
    return [
        [*not_spot, {"key": key, "operator": "In", "values": sorted(values)}]
        for key, values in sorted(capacity.on_demand_values(config.label_schemes).items())
    ]


def on_demand_expressions(config: Config) -> list[dict[str, Any]]:
    """Every expression the on-demand requirement adds (to recognise spotguard's own)."""
    out: list[dict[str, Any]] = []
    for term in on_demand_terms(config):
        out += [e for e in term if e not in out]
    return out


def spot_terms(config: Config, keys: Iterable[str] | None = None) -> list[list[dict[str, Any]]]:
    """The spot requirement of a move's new replica (:func:`spotguard.policy.moves.launching`):
    spot under some scheme, one ORed list per label key; only the keys in ``keys`` (the label
    keys the cluster's nodes carry) where any is: a provisioner that honours each term (Karpenter
    relaxes ORed terms one at a time) is not asked for a label no node of it carries."""
    wanted = capacity.spot_values(config.label_schemes)
    present = {k for k in wanted if keys is not None and k in set(keys)}
    return [
        [{"key": key, "operator": "In", "values": sorted(values)}]
        for key, values in sorted(wanted.items())
        if not present or key in present
    ]


def spot_preferences(config: Config) -> list[dict[str, Any]]:
    """One preferred term per label key: the node is spot under that key."""
    return [
        {
            "weight": config.spot_preference_weight,
            "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": sorted(values)}]},
        }
        for key, values in sorted(capacity.spot_values(config.label_schemes).items())
    ]


def _set_in_map(obj: Mapping[str, Any], parent: Sequence[str], key: str, value: str) -> list[Op]:
    """Ops that make ``obj[parent...][key] == value``."""
    current: Any = obj
    for p in parent:
        current = current.get(p) if isinstance(current, Mapping) else None
    if not isinstance(current, Mapping):
        return [{"op": "add", "path": pointer(*parent), "value": {key: value}}]
    if current.get(key) == value:
        return []
    op = "replace" if key in current else "add"
    return [{"op": op, "path": pointer(*parent, key), "value": value}]


def _ensure_path(spec: Mapping[str, Any], tokens: Sequence[str], leaf: Any) -> tuple[list[Op], Any]:
    """Walk ``spec`` along ``tokens``; where the path stops, one op adds the rest.

    Returns (ops, existing leaf or None).
    """
    current: Any = spec
    for i, tok in enumerate(tokens):
        nxt = current.get(tok) if isinstance(current, Mapping) else None
        if nxt is None:
            value: Any = leaf
            for t in reversed(tokens[i + 1 :]):
                value = {t: value}
            return [{"op": "add", "path": pointer("spec", *tokens[: i + 1]), "value": value}], None
        current = nxt
    return [], current


def _on_demand_ops(spec: Mapping[str, Any], config: Config) -> list[Op]:
    return _required_ops(spec, on_demand_terms(config))


def _required_ops(spec: Mapping[str, Any], wanted: Sequence[Sequence[Mapping[str, Any]]]) -> list[Op]:
    """ANDs the requirement ``wanted`` (ORed lists of ANDed expressions) into every term."""
    if not wanted:
        return []  # no node can be on-demand under this configuration: nothing to require
    tokens = ("affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms")
    fresh = [{"matchExpressions": list(w)} for w in wanted]
    ops, terms = _ensure_path(spec, tokens, fresh)
    if ops:
        return ops
    if not terms:
        return [{"op": "replace", "path": pointer("spec", *tokens), "value": fresh}]
    if len(wanted) > 1:
        return _cross_terms(terms, wanted, tokens)
    out: list[Op] = []
    for i, term in enumerate(terms):
        exprs = term.get("matchExpressions")
        missing = [e for e in wanted[0] if exprs is None or e not in exprs]
        if exprs is None:
            out.append({"op": "add", "path": pointer("spec", *tokens, i, "matchExpressions"), "value": missing})
            continue
        for expr in missing:
            out.append({"op": "add", "path": pointer("spec", *tokens, i, "matchExpressions", "-"), "value": expr})
    return out


def _cross_terms(
    terms: Sequence[Mapping[str, Any]], wanted: Sequence[Sequence[Mapping[str, Any]]], tokens: Sequence[str]
) -> list[Op]:
    """Each user term ANDed with each alternative of the requirement (terms are ORed)."""
    if all(any(all(e in (t.get("matchExpressions") or []) for e in w) for w in wanted) for t in terms):
        return []
    crossed: list[dict[str, Any]] = []
    for w in wanted:  # the user's terms, in their order, with the first alternative come first
        for term in terms:
            exprs = list(term.get("matchExpressions") or [])
            new = {**term, "matchExpressions": exprs + [e for e in w if e not in exprs]}
            crossed.append(new)
    return [{"op": "replace", "path": pointer("spec", *tokens), "value": crossed}]


def _applied(spec: Mapping[str, Any], ops: Sequence[Op]) -> dict[str, Any]:
    """``spec`` with this module's own ``add``/``replace`` ops under ``/spec`` applied (a copy)."""
    out: dict[str, Any] = copy.deepcopy(dict(spec))
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[2:]]
        parent: Any = out
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        if isinstance(parent, list):
            if last == "-":
                parent.append(copy.deepcopy(op["value"]))
            else:
                parent[int(last)] = copy.deepcopy(op["value"])
        else:
            parent[last] = copy.deepcopy(op["value"])
    return out


def _append_missing(spec: Mapping[str, Any], tokens: Sequence[str], items: Sequence[Any], present: Any) -> list[Op]:
    """Append ``items`` not yet ``present`` (a predicate) to the list at spec[tokens]."""
    ops, existing = _ensure_path(spec, tokens, list(items))
    if ops:
        return ops if items else []
    out: list[Op] = []
    for item in items:
        if not present(existing, item):
            out.append({"op": "add", "path": pointer("spec", *tokens, "-"), "value": item})
    return out


def spread_selector(pod: Mapping[str, Any]) -> dict[str, str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return {k: v for k, v in labels.items() if k not in VOLATILE_LABELS}


# The label node-added writes on every spot node (by the configured schemes), and only on
# those: a spot-only key where the provider has none (EKS managed node groups, Karpenter and
# ``node.kubernetes.io/capacity`` label their on-demand nodes with the capacity key too). It
# says nothing about capacity (no scheme reads it); a spot slot's spread covers it.
SPOT_NODE_LABEL = "spotguard.io/spot"
SPOT_NODE_VALUE = "true"


def spot_node_labels(nodes: Iterable[tuple[str, Mapping[str, str]]], config: Config) -> dict[str, str | None]:
    """Node name -> the :data:`SPOT_NODE_LABEL` value to set (``"true"``) or remove (None),
    for the nodes whose label is not what their capacity says: every spot node carries it,
    no other node does. ``nodes``: (name, labels) pairs."""
    out: dict[str, str | None] = {}
    for name, labels in nodes:
        spot = config.node_capacity(labels) is Capacity.SPOT
        if spot and labels.get(SPOT_NODE_LABEL) != SPOT_NODE_VALUE:
            out[name] = SPOT_NODE_VALUE
        elif not spot and SPOT_NODE_LABEL in labels:
            out[name] = None
    return out


def spot_only_key(nodes: Iterable[Mapping[str, str]], config: Config) -> str | None:
    """A label key that every spot node carries and no other node does: one of the
    configured schemes (GKE's ``cloud.google.com/gke-spot`` and ``gke-preemptible``, AKS's
    ``kubernetes.azure.com/scalesetpriority``), else :data:`SPOT_NODE_LABEL` where
    node-added has labelled every spot node (EKS, Karpenter); None when the cluster has
    none or no spot node.

    ``nodes`` are the nodes' label maps."""
    spot: list[Mapping[str, str]] = []
    other: list[Mapping[str, str]] = []
    for n in nodes:
        (spot if config.node_capacity(n) is Capacity.SPOT else other).append(n)
    if not spot:
        return None
    for key in [*sorted(capacity.spot_values(config.label_schemes)), SPOT_NODE_LABEL]:
        if all(key in n for n in spot) and not any(key in n for n in other):
            return key
    return None


def spread_constraints(pod: Mapping[str, Any], config: Config, spot_key: str | None = None) -> list[dict[str, Any]]:
    """A spot slot's soft spread: across ``config.spread_topology_keys`` (nodes and zones),
    and, where the cluster has a spot-only label key, across that key too.

    kube-scheduler's PodTopologySpread scores 0 every node that lacks one of the pod's
    topology keys (``IgnoredNodes`` in scoring.go) and gives the least-loaded of the others
    100: the extra constraint keeps the spread to the spot nodes, so an empty on-demand
    node can no longer outscore a spot node with room (the spot preference alone is worth
    at most 200 points). Its one domain holds every spot node, so it changes nothing
    between them."""
    selector = spread_selector(pod)
    keys = list(config.spread_topology_keys)
    if not selector or not keys:
        return []
    if spot_key and spot_key not in keys:
        keys.append(spot_key)
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
        for key in keys
    ]


def _spot_ops(pod: Mapping[str, Any], spec: Mapping[str, Any], config: Config, spot_key: str | None) -> list[Op]:
    ops = _append_missing(
        spec,
        ("affinity", "nodeAffinity", PREFERRED),
        spot_preferences(config),
        lambda existing, item: any(
            (e.get("preference") or {}).get("matchExpressions") == item["preference"]["matchExpressions"]
            for e in existing
        ),
    )
    if config.spot_tolerations:
        ops += _append_missing(
            spec,
            ("tolerations",),
            [t.to_json() for t in config.spot_tolerations],
            lambda existing, item: Toleration.from_json(item) in {Toleration.from_json(e) for e in existing},
        )
    constraints = spread_constraints(pod, config, spot_key)
    if constraints:
        ops += _append_missing(
            spec,
            ("topologySpreadConstraints",),
            constraints,
            lambda existing, item: any(e.get("topologyKey") == item["topologyKey"] for e in existing),
        )
    return ops


def spot_slot_spec(pod: Mapping[str, Any], config: Config, spot_key: str | None = None) -> dict[str, Any]:
    """``pod``'s spec as a spot slot's (what :func:`build` gives it for :attr:`Placement.SPOT`:
    spot preferred, the spot tolerations, the soft spread over ``pod``'s labels), a copy; for a
    pod template that no admission decision places (a surge copy's,
    :func:`spotguard.policy.surgecopy.build`)."""
    spec = pod.get("spec") or {}
    return _applied(spec, _spot_ops(pod, spec, config, spot_key))


def _annotated(pod: Mapping[str, Any], wanted: Mapping[str, str]) -> list[Op]:
    """Ops that set ``wanted`` in the pod's annotations (creating the map where it is none)."""
    if not wanted:
        return []
    current = (pod.get("metadata") or {}).get("annotations")
    if not isinstance(current, Mapping):
        return [{"op": "add", "path": pointer("metadata", "annotations"), "value": dict(wanted)}]
    ops: list[Op] = []
    for key, value in wanted.items():
        ops += _set_in_map(pod, ("metadata", "annotations"), key, value)
    return ops


def surge_protection(annotations: Mapping[str, str]) -> dict[str, str]:
    """The annotations that keep a surge replica where it is while the surge is needed:
    ``karpenter.sh/do-not-disrupt: "true"`` (Karpenter does not consolidate its node) and
    ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` (the Cluster Autoscaler does
    not scale its node down), each where the pod does not say otherwise already, and
    ``spotguard.io/surge-protected`` naming the keys set (the surge's finish removes them:
    :func:`surge_unprotection`). Empty when the pod carries them all (a reinvocation)."""
    mine = [k for k in SURGE_PROTECTION if k not in annotations]
    listed = [k for k in (annotations.get(SURGE_PROTECTED) or "").split(",") if k]
    if not mine:
        return {}
    out = {k: SURGE_PROTECTION[k] for k in mine}
    out[SURGE_PROTECTED] = ",".join(sorted({*listed, *mine}))
    return out


def floor_protection(annotations: Mapping[str, str]) -> dict[str, str]:
    """What :func:`surge_protection` sets, for a pod of a StatefulSet whose every replica is its
    floor (:func:`spotguard.policy.floors.every_pod_is_floor`), for good: no node autoscaler
    consolidates or scales down its node, since no drain could take it without breaking the
    floor. ``spotguard.io/floor-protected`` names the keys set (a pod that says otherwise
    already keeps its own value). Empty when there is nothing to set."""
    mine = [k for k in SURGE_PROTECTION if k not in annotations]
    if not mine:
        return {}
    return {**{k: SURGE_PROTECTION[k] for k in mine}, FLOOR_PROTECTED: ",".join(sorted(mine))}


def surge_unprotection(annotations: Mapping[str, str]) -> dict[str, None]:
    """A merge patch of ``metadata.annotations`` that removes what :func:`surge_protection`
    set (empty when nothing is left to remove)."""
    listed = [k for k in (annotations.get(SURGE_PROTECTED) or "").split(",") if k in SURGE_PROTECTION]
    if SURGE_PROTECTED not in annotations:
        return {}
    return {**{k: None for k in listed if k in annotations}, SURGE_PROTECTED: None}


def build(
    pod: Mapping[str, Any],
    placement: Placement,
    config: Config,
    surge: bool = False,
    spot_key: str | None = None,
    *,
    cost: int | None = None,
    require_spot: bool = False,
    node_keys: Iterable[str] | None = None,
    keep: bool = False,
    move: str = "",
) -> list[Op]:
    """The JSONPatch that puts ``pod`` in ``placement``; empty when it already is.

    ``surge``: an on-demand slot of a surge in progress: marked ``spotguard.io/surge-replica``
    and given no deletion cost (an extra replica, the first to go after the dead pods), and
    protected from the node autoscalers while the surge is needed (:func:`surge_protection`).
    ``spot_key``: the cluster's spot-only label key (:func:`spot_only_key`), spread over
    by a spot slot. ``cost``: the pod's ranked deletion cost (:mod:`spotguard.policy.ranks`);
    without one an on-demand pod gets ``on_demand_deletion_cost`` (above every ranked pod)
    and a spot pod none. A deletion cost the pod already has (its template's) is kept.
    ``require_spot``: a spot slot created for a move back to spot
    (:func:`spotguard.policy.moves.launching`) also requires spot, ANDed into the user's
    terms as the on-demand requirement is: where no spot node has room it waits Pending
    for the provisioner to launch one, rather than filling on-demand room; ``move`` names that
    move (:func:`spotguard.policy.moves.move_id`), written as ``spotguard.io/move-requires-spot``
    so that the node-added reconcile can tell spotguard's requirement from a user's and take the
    pod if it is still Pending once the move is over (:func:`spotguard.policy.moves.stranded`).
    ``keep``: an
    on-demand pod of a StatefulSet whose every replica is its floor: protected from the node
    autoscalers for good (:func:`floor_protection`)."""
    spec = pod.get("spec") or {}
    ops: list[Op] = []
    if placement is Placement.ON_DEMAND:
        ops += _on_demand_ops(spec, config)
    else:
        if require_spot:
            ops += _required_ops(spec, spot_terms(config, node_keys))
            # The spot preferences after it, on the spec as it leaves (both may add /spec/affinity).
            spec = _applied(spec, ops)
        ops += _spot_ops(pod, spec, config, spot_key)
    ops += _set_in_map(pod, ("metadata", "labels"), PLACEMENT_LABEL, placement.value)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if placement is Placement.SPOT and require_spot and move:
        marker = {MOVE_REQUIRES_SPOT: move}
        ops += _annotated(pod, marker)
        annotations = {**annotations, **marker}
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "annotations": annotations}}
    if placement is Placement.ON_DEMAND and surge:
        ops += _annotated(pod, {SURGE_REPLICA: "true", **surge_protection(annotations)})
        return ops
    if placement is Placement.ON_DEMAND and keep:
        protection = floor_protection(annotations)
        ops += _annotated(pod, protection)
        annotations = {**annotations, **protection}
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "annotations": annotations}}
    if DELETION_COST in annotations:
        pass
    elif cost is not None:
        # Scale-down keeps the lowest replica numbers: exactly the floor's on-demand pods.
        ops += _set_in_map(pod, ("metadata", "annotations"), DELETION_COST, str(cost))
    elif placement is Placement.ON_DEMAND and config.on_demand_deletion_cost:
        # Scale-down removes spot replicas before this on-demand pod.
        ops += _set_in_map(pod, ("metadata", "annotations"), DELETION_COST, str(config.on_demand_deletion_cost))
    return ops
