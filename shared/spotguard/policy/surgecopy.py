"""The surge copy: a temporary spotguard-owned ReplicaSet that surges a Deployment
without writing anything the Deployment's owner owns. Pure; no I/O.

The default surge (``surge_copy``; ``false`` keeps the replica surge). The copy carries
its surge's record (:data:`RECORD`): a copy's surge writes nothing on the Deployment, and
the plans read a Deployment's record from its copy (:func:`with_record`).

Why a copy. A surge in ``spec.replicas`` is a field other writers own: Argo CD's
self-heal reverts it within seconds, ``kubectl replace``, Argo CD ``Replace=true``
and ``helm upgrade --force`` put the manifest's count back, the HPA writes it at its
sync period. A ReplicaSet of spotguard's, holding a copy of the Deployment's pod
template, is nobody else's object:

- **No controller adopts it or its pods** (upstream ``controller_ref_manager.go``,
  ``claimObject``): a Deployment adopts a ReplicaSet with no controller reference
  whose *own* labels match its selector (``ClaimReplicaSets`` matches
  ``obj.GetLabels()``, not the template). The copy's own labels are spotguard's
  only, and :func:`build` refuses a Deployment whose selector would match them
  (a selector of ``NotIn``/``DoesNotExist`` only). A ReplicaSet adopts orphan pods
  matching its selector and ignores pods whose controller reference names someone
  else: the copy's pods carry its controller reference (the ReplicaSet controller
  sets it), and the copy's selector adds :data:`SURGE_OF`, a label the Deployment's
  pods lack (refused where the template already carries it), so the copy never
  adopts the Deployment's pods either.
- **Services, PodDisruptionBudgets, NetworkPolicies see its pods**: the template's
  labels are the Deployment's plus :data:`SURGE_OF`, so every selector that matches
  the Deployment's pods matches the copy's.
- **The HPA counts them**: it reads metrics of every Ready pod matching the scale
  subresource's selector (the Deployment's), whoever owns them
  (kubernetes/kubernetes#116898, #124307; KEP 5325 open), and recommends
  ``ceil(usageRatio * readyPodCount)`` (``replica_calculator.go``,
  ``GetResourceReplicas``): the total load over the per-pod target, whatever the
  number of pods sharing it. The copy's pods lower the average and raise the pod
  count by as much, so the recommendation is the count the load needs, as without
  them (pods still in the CPU initialization period are left out of both). Its
  ``spec.replicas`` writes no longer undo the surge, so the surge needs no
  ``minReplicas`` raise.
- **GitOps tools leave it alone**: Argo CD prunes only resources it tracks (its
  tracking label or ``argocd.argoproj.io/tracking-id`` annotation), and gitops-engine
  skips any live object with owner references when listing managed objects
  (``GetManagedLiveObjs``: ``len(o.OwnerRefs) == 0``; argoproj/argo-cd#4764, #26556).
  The copy carries no tracking label or annotation (the Deployment's metadata is
  not copied; argoproj/argo-cd#8683 shows a copy with the owner's tracking
  annotation marked for pruning), and its pods have an owner. Flux prunes only
  objects in its Kustomization's inventory (what it applied), and skips objects
  with ``blockOwnerDeletion`` owners (fluxcd/kustomize-controller#411).
- **No owner reference to the Deployment**: ``kubectl replace --force`` and
  Argo CD ``Replace=true,Force=true`` delete and re-create the Deployment; an owner
  reference would let the garbage collector delete the copy and its pods with it,
  at the moment they are the only pods serving. spotguard deletes the copy itself
  (the surge ledger and the reconcile find it by :data:`SURGE_OF`).

StatefulSets cannot be surged this way: their pods have identities (ordinals,
volumes claimed per ordinal) that a copy cannot take; they keep their floor by
placement (on-demand quorum) and are never surged.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import patches
from spotguard.policy.config import Config
from spotguard.policy.interruption import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    copy_workload_key,
    selector_matches,
    workload_key_of,
)
from spotguard.policy.placement import Placement
from spotguard.policy.surges import ON_COPY, SurgeRecord
from spotguard.policy.views import PodView
from spotguard.policy.workloads import (
    PLACEMENT_LABEL,
    SURGE,
    SURGE_COPY_PREFIX,
    SURGE_FOR,
    SURGE_OF,
    SURGE_REPLICA,
    Kind,
    Workload,
    surge_copy_name,
    surge_deployment,
    surge_of_label,
)

# On the copy (SURGE_FOR, on its pods too): "Deployment/<name>" and the Deployment's uid when
# the copy was made.
SURGE_FOR_UID = "spotguard.io/surge-for-uid"
EVENTS = "spotguard.io/events"
# On the copy: its surge's record, the only one (the Deployment carries none), written with
# the copy's create and each record change in one conditional write. Nobody else writes the
# copy, so no replace of the Deployment takes it.
RECORD = "spotguard.io/surge-record"
PREFIX = SURGE_COPY_PREFIX


@dataclass(frozen=True)
class Refusal:
    """Why a workload cannot be surged by a copy (the surge is skipped, the reason logged)."""

    reason: str


def copy_of(replicaset: Mapping[str, Any]) -> str | None:
    """The name of the Deployment whose surge copy ``replicaset`` is, or None: labelled
    :data:`SURGE_OF` and named as that Deployment's copy (a ReplicaSet named otherwise is not
    spotguard's copy of it)."""
    meta = replicaset.get("metadata") or {}
    of = surge_deployment(meta.get("labels") or {}, meta.get("annotations") or {})
    return of if of is not None and meta.get("name") == surge_copy_name(of) else None


def copies_by_key(replicasets: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Deployment key -> its surge copy, among ``replicasets``."""
    out: dict[str, Any] = {}
    for rs in replicasets:
        if (of := copy_of(rs)) is not None:
            out[f"{Kind.DEPLOYMENT}/{(rs.get('metadata') or {}).get('namespace')}/{of}"] = rs
    return out


def views_with_records(views: Mapping[str, Workload], replicasets: Iterable[Mapping[str, Any]]) -> dict[str, Workload]:
    """``views`` (workload key -> view) with each Deployment's copy record as its record
    (:func:`with_record`), as the functions see them."""
    out = dict(views)
    for key, rs in copies_by_key(replicasets).items():
        if key in out:
            out[key] = with_record(out[key], record_of(rs))
    return out


def workload_of_copy_pod(pod: PodView) -> str | None:
    """``Deployment/<ns>/<name>`` for a pod of a surge copy, else None
    (:func:`interruption.copy_workload_key`): these pods are the Deployment's replicas for
    the eviction guard and spotguard's own drain, though no ReplicaSet of the Deployment
    owns them."""
    return copy_workload_key(pod)


def copy_labels(deployment: str) -> dict[str, str]:
    """The copy's own labels: spotguard's only, never the Deployment's."""
    return {MANAGED_BY_LABEL: MANAGED_BY, SURGE_OF: surge_of_label(deployment)}


def build(
    deployment: Mapping[str, Any],
    size: int,
    config: Config,
    events: Sequence[str] = (),
    *,
    on_demand: bool = True,
    spot_key: str | None = None,
    record: SurgeRecord | None = None,
) -> dict[str, Any] | Refusal:
    """The surge copy of ``deployment`` with ``size`` replicas pinned to on-demand, or why not.

    ``on_demand=False``: a surge none of whose replicas must be on-demand (every one replaces
    a pod of a spot node a node autoscaler only drains, or one its floor does not need on an
    on-demand node it drains: ``SurgeRecord.on_demand_surge`` is 0). Its pods are spot slots
    instead (the admission patch's: spot preferred, the spot tolerations, the soft spread
    with the Deployment's pods, ``spot_key`` as :func:`patches.spread_constraints`), labelled
    ``spotguard.io/placement: spot``: they go where the Deployment's spot replicas go, into
    the room the autoscaler's own simulation found for the drained pods, as the replica
    surge's do (:func:`spotguard.policy.floors.floor_for`). Pinned to on-demand they would
    make the autoscaler launch an on-demand node for every consolidation of a spot node, a
    node it consolidates in turn once the surge is over: the cluster never settles."""
    kind = str(deployment.get("kind") or "Deployment")
    if kind != "Deployment":
        return Refusal(f"a {kind} is not surged: its floor is kept by placement")
    if size < 0:
        return Refusal("a negative size")
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "")
    selector = spec.get("selector")
    template = spec.get("template") or {}
    tmeta = template.get("metadata") or {}
    pod_labels = dict(tmeta.get("labels") or {})
    if not isinstance(selector, Mapping) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return Refusal("the Deployment has no selector")
    if not name:
        return Refusal("the Deployment has no name")
    if SURGE_OF in pod_labels:
        return Refusal(f"the pod template carries {SURGE_OF}: the copy's selector would match the Deployment's pods")
    own = copy_labels(name)
    if selector_matches(selector, own):
        return Refusal("the Deployment's selector matches any ReplicaSet's labels: it would adopt the copy")
    labels = {**pod_labels, SURGE_OF: own[SURGE_OF]}
    if not selector_matches(selector, labels):
        return Refusal("the pod template does not match the Deployment's selector")
    copy_selector = copy.deepcopy(dict(selector))
    copy_selector["matchLabels"] = {**(copy_selector.get("matchLabels") or {}), SURGE_OF: own[SURGE_OF]}
    # SURGE_FOR on the pods too: the whole name where the label holds a digest (over 63 characters).
    pod_annotations = {**(tmeta.get("annotations") or {}), SURGE_REPLICA: "true", SURGE_FOR: f"Deployment/{name}"}
    # Kept where they are while the surge needs them, as the replica surge's are (admission
    # protects those; it skips the copy's pods): no node autoscaler consolidates or scales down
    # their node. Without it Karpenter consolidated an on-demand node holding copy pods in the
    # middle of the demo's rebalance surge, and its drain took db below its floor once the
    # eviction guard's floor hold was over. The copy's deletion ends the protection with them.
    pod_annotations.update(patches.surge_protection(pod_annotations))
    pod_spec = copy.deepcopy(dict(template.get("spec") or {}))
    if on_demand:
        pod_spec["affinity"] = pin_on_demand(pod_spec.get("affinity"), config)
    else:
        # Spread with the Deployment's own pods (its template's labels, not the copy's).
        pod_spec = patches.spot_slot_spec({"metadata": {"labels": pod_labels}, "spec": pod_spec}, config, spot_key)
        labels[PLACEMENT_LABEL] = Placement.SPOT.value
    annotations = {SURGE_FOR: f"Deployment/{name}", EVENTS: ",".join(events)[:1000]}
    if meta.get("uid"):
        annotations[SURGE_FOR_UID] = str(meta["uid"])
    if record is not None:
        annotations[RECORD] = plain(record)
    out_spec: dict[str, Any] = {
        "replicas": size,
        "selector": copy_selector,
        "template": {"metadata": {"labels": labels, "annotations": pod_annotations}, "spec": pod_spec},
    }
    if spec.get("minReadySeconds"):
        out_spec["minReadySeconds"] = spec["minReadySeconds"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": surge_copy_name(name), "namespace": namespace, "labels": own, "annotations": annotations},
        "spec": out_spec,
    }


def spot_slots(replicaset: Mapping[str, Any]) -> bool:
    """Whether a copy's pods are spot slots (a drain-only surge's, :func:`build`)."""
    template = (replicaset.get("spec") or {}).get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    return labels.get(PLACEMENT_LABEL) == Placement.SPOT.value


def update_patch(
    current: Mapping[str, Any],
    size: int,
    record: SurgeRecord,
    *,
    on_demand_template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The merge patch that brings the copy ``current`` (as read) to ``size`` replicas carrying
    ``record``, guarded by its resourceVersion (a 409 Conflict where anyone wrote it since).
    ``on_demand_template``: the template of a fresh :func:`build` pinned to on-demand, for a
    copy of spot slots whose surge now needs on-demand (an interruption warning came for a
    node an autoscaler only drained): the copy's next pods go to on-demand; the ones it has
    stay where they are (a ReplicaSet does not replace its pods for a template change)."""
    meta = current.get("metadata") or {}
    out: dict[str, Any] = {
        "metadata": {"annotations": {RECORD: plain(record), EVENTS: ",".join(record.events)[:1000]}},
        "spec": {"replicas": max(0, size)},
    }
    if meta.get("resourceVersion"):
        out["metadata"]["resourceVersion"] = meta["resourceVersion"]
    if on_demand_template is not None:
        old = (current.get("spec") or {}).get("template") or {}
        out["spec"]["template"] = merge_diff(old, on_demand_template)
    return out


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: keys ``new`` lacks
    set to null, objects patched key by key, anything else (lists too) replaced."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        was = old.get(k)
        if isinstance(v, Mapping) and isinstance(was, Mapping):
            inner = merge_diff(was, v)
            if inner:
                out[k] = inner
        elif k not in old or was != v:
            out[k] = copy.deepcopy(v)
    return out


def resize(replicas: int, record: SurgeRecord | None = None, *, resource_version: str | None = None) -> dict[str, Any]:
    """The merge patch that sizes the copy, its record (:data:`RECORD`) brought up to date;
    guarded by ``resource_version`` where given (a 409 where the copy changed since)."""
    out: dict[str, Any] = {"spec": {"replicas": replicas}}
    meta: dict[str, Any] = {}
    if record is not None:
        meta["annotations"] = {RECORD: plain(record)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if meta:
        out["metadata"] = meta
    return out


def with_record(view: Workload, record: SurgeRecord | None) -> Workload:
    """The Deployment as the plans see it: its copy's record (a copy's surge writes nothing
    on the Deployment) as its surge record, marked :data:`surges.ON_COPY`. A record on the
    Deployment itself (a surge begun before records moved to the copy) gives way to the
    copy's, which each copy write brings up to date."""
    if record is None:
        return view
    extra = {SURGE: plain(record), ON_COPY: "true"}
    return dataclasses.replace(view, annotations={**view.annotations, **extra})


def record_of(replicaset: Mapping[str, Any]) -> SurgeRecord | None:
    """The surge record a copy carries (:data:`RECORD`), or None."""
    text = ((replicaset.get("metadata") or {}).get("annotations") or {}).get(RECORD)
    return SurgeRecord.parse(str(text)) if text else None


def plain(record: SurgeRecord) -> str:
    """The record as the copy carries it (never marked lost)."""
    return dataclasses.replace(record, lost=False).to_json()


def pin_on_demand(affinity: Mapping[str, Any] | None, config: Config) -> dict[str, Any]:
    """``affinity`` with the on-demand requirement ANDed into every required node term
    (the same requirement as the admission patch, :func:`patches.on_demand_terms`)."""
    out = copy.deepcopy(dict(affinity or {}))
    wanted = patches.on_demand_terms(config)
    if not wanted:
        return out
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault(patches.REQUIRED, {})
    terms = list(required.get("nodeSelectorTerms") or [])
    if not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": list(w)} for w in wanted]
        return out
    crossed: list[dict[str, Any]] = []
    for w in wanted:  # terms are ORed: each of the user's terms ANDed with each alternative
        for term in terms:
            exprs = list(term.get("matchExpressions") or [])
            crossed.append({**term, "matchExpressions": exprs + [e for e in w if e not in exprs]})
    required["nodeSelectorTerms"] = crossed
    return out


# --- the copy's life: one state machine --------------------------------------------------

# How long past the last doomed node's deadline the copy waits for the Deployment's own
# replacements (the same grace as the replica surge's scale back).
HANDBACK_GRACE = 300.0


class CopyState(enum.StrEnum):
    NONE = "none"  # no surge: no copy wanted
    COVERING = "covering"  # a doomed node still serves the Deployment's pods: the copy stands in for them
    HANDING_BACK = "handing-back"  # the doomed pods are dead: the copy waits for the Deployment's own replacements
    DONE = "done"  # the Deployment serves its count on nodes that stay (or the wait ran out): the copy goes


class Action(enum.StrEnum):
    CREATE = "create"
    RESIZE = "resize"
    KEEP = "keep"
    DELETE = "delete"
    NOTHING = "nothing"


@dataclass(frozen=True)
class CopyFacts:
    """What one pass reads about one surging Deployment (the handler only counts)."""

    replicas_now: int  # the Deployment's spec.replicas now: the owner's count, whoever wrote it
    ready_before: int  # its Ready pods when the surge began (the record's ``ready``; 0: unknown)
    own_ready_staying: int  # the Deployment's own Ready pods on nodes that stay
    own_on_doomed: int  # the Deployment's own active pods on doomed nodes still before their deadline
    copy_replicas: int | None  # the copy's spec.replicas; None: there is no copy
    last_deadline: float  # the latest reclaim time of the surge's doomed nodes
    now: float
    # The copy's own active pods on doomed nodes still before their deadline (a copy of spot
    # slots whose node a later warning dooms): each needs a replacement of its own.
    copy_on_doomed: int = 0


@dataclass(frozen=True)
class CopyStep:
    state: CopyState
    action: Action
    replicas: int  # the copy's size after the step (0: no copy)
    reason: str


def copy_step(f: CopyFacts) -> CopyStep:
    """The copy's state and the one step it asks for.

    The copy holds exactly what the Deployment's own pods on nodes that stay lack of the
    count to keep: ``min(the owner's count now, Ready before the notice)``. A change of
    the owner's count during the surge (a GitOps revert, a replace, an autoscaler) is
    kept; the surge never serves above the pre-notice count. The copy's own pods on a doomed
    node (spot slots a later warning caught) are counted on top while they serve there: a
    ReplicaSet replaces a pod only once it is gone, at the reclaim, too late.
    """
    target = min(f.replicas_now, f.ready_before) if f.ready_before > 0 else f.replicas_now
    need = max(0, target - f.own_ready_staying)
    covering = (f.own_on_doomed > 0 or f.copy_on_doomed > 0) and f.now < f.last_deadline
    if covering and need > 0:
        need += f.copy_on_doomed
    if covering:
        state = CopyState.COVERING
    elif need > 0 and f.now < f.last_deadline + HANDBACK_GRACE:
        state = CopyState.HANDING_BACK
    else:
        state = CopyState.DONE
    if state is CopyState.DONE or need == 0:
        if f.copy_replicas is None:
            return CopyStep(state, Action.NOTHING, 0, _why(state, need, target))
        return CopyStep(state, Action.DELETE, 0, _why(state, need, target))
    if f.copy_replicas is None:
        return CopyStep(state, Action.CREATE, need, _why(state, need, target))
    if f.copy_replicas != need:
        return CopyStep(state, Action.RESIZE, need, _why(state, need, target))
    return CopyStep(state, Action.KEEP, need, _why(state, need, target))


def size_of_found_copy(asked: int, found: int) -> int | None:
    """The size to give a copy this pass found made since its read (its create answered
    AlreadyExists: another pass made it, or this pass's own create whose answer was lost).

    This pass counted on a read older than that copy (node-added's pass carries out the copy
    steps on its snapshot at the end of its own work, tens of seconds later under hung
    requests): the copy's maker may have counted on a later record (more doomed nodes) or
    later pods. So a stale count only grows a copy, never shrinks it: one replica too many
    costs a pod until the next pass resizes it; one too few is a doomed pod left without
    its replacement at the reclaim. None: leave it."""
    return asked if asked > found else None


def _why(state: CopyState, need: int, target: int) -> str:
    if state is CopyState.DONE and need > 0:
        return f"waited {int(HANDBACK_GRACE)}s past the last reclaim for {need} of {target} replacements"
    if need == 0:
        return f"the Deployment serves its {target} on nodes that stay"
    return f"{need} of {target} still to be served by the Deployment's own pods on nodes that stay"


def facts_for(
    workload: Workload,
    ready_before: int,
    pods: Iterable[PodView],
    *,
    doomed: Collection[str],
    live_doomed: Collection[str],
    copy_replicas: int | None,
    last_deadline: float,
    now: float,
    replicaset_owners: Mapping[tuple[str, str], str] | None = None,
) -> CopyFacts:
    """Count what :func:`copy_step` decides on. ``doomed``: the surge's nodes; ``live_doomed``:
    those that still exist and are before their deadline. The Deployment's own pods are those
    of its ReplicaSets (:func:`workload_key_of`); the copy's pods (:func:`copy_workload_key`)
    count only where a doomed node holds them."""
    own = [p for p in pods if p.active and workload_key_of(p, replicaset_owners) == workload.key]
    copy_on_doomed = sum(
        1 for p in pods if p.active and p.node_name in live_doomed and copy_workload_key(p) == workload.key
    )
    return CopyFacts(
        replicas_now=workload.replicas,
        ready_before=ready_before,
        own_ready_staying=sum(1 for p in own if p.ready and p.node_name and p.node_name not in doomed),
        own_on_doomed=sum(1 for p in own if p.node_name in live_doomed),
        copy_replicas=copy_replicas,
        last_deadline=last_deadline,
        now=now,
        copy_on_doomed=copy_on_doomed,
    )
