"""Deployment controller (pkg/controller/deployment): one ReplicaSet per pod
template, named ``<deployment>-<pod-template-hash>``; RollingUpdate
(maxSurge/maxUnavailable) and Recreate; revision annotations; status.

Its writes go through its own client's rate limit (``--kube-api-qps`` 20, burst 30:
spotguard_sim.controllers.ratelimit), as every kube-controller-manager controller's
do: a write is sent (and a token taken) only where it changes the object, as upstream
compares before it updates (``syncRolloutStatus``: no update for an equal status).

https://kubernetes.io/docs/concepts/workloads/controllers/deployment/
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

from spotguard_sim import errors, intstr, settings
from spotguard_sim.controllers import base

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand.SafeEncodeString


def fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    return "".join(_SAFE[b % len(_SAFE)] for b in text.encode())


def template_hash(template: dict[str, Any], collision_count: int | None = None) -> str:
    """controller.ComputeHash: fnv32a of the template (and collisionCount), safe-encoded."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count is not None:
        data += str(collision_count).encode()
    return safe_encode(str(fnv32a(data)))


def _without_hash(template: dict[str, Any]) -> dict[str, Any]:
    t = copy.deepcopy(template)
    labels = (t.get("metadata") or {}).get("labels")
    if labels:
        labels.pop(HASH_LABEL, None)
    return t


def _revision(rs: dict[str, Any]) -> int:
    try:
        return int(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _newest_first(rs: dict[str, Any]) -> str:
    """A sort key that puts later creation timestamps first."""
    stamp = rs["metadata"].get("creationTimestamp", "")
    return "".join(chr(0x10FFFF - ord(c)) for c in stamp)


def _spec_replicas(obj: dict[str, Any]) -> int:
    return int((obj.get("spec") or {}).get("replicas", 1) or 0)


def _status(obj: dict[str, Any], field: str) -> int:
    return int((obj.get("status") or {}).get(field) or 0)


def surge_and_unavailable(deploy: dict[str, Any]) -> tuple[int, int]:
    """ResolveFenceposts: maxSurge rounds up, maxUnavailable down; never both 0."""
    strategy = (deploy.get("spec") or {}).get("strategy") or {}
    replicas = _spec_replicas(deploy)
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return 0, 0
    rolling = strategy.get("rollingUpdate") or {}
    surge = intstr.scaled(rolling.get("maxSurge", "25%"), replicas, True)
    unavailable = intstr.scaled(rolling.get("maxUnavailable", "25%"), replicas, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


MAX_RETRIES = 15  # pkg/controller/deployment/deployment_controller.go maxRetries


class DeploymentController(base.Controller):
    name = "deployment-controller"
    primary = "deployments"
    workers = 2

    def __init__(
        self, store: Any, informer: base.Informer, *, limits: settings.ControllerManager | None = None
    ) -> None:
        super().__init__(store, informer)
        self.limits = limits or settings.ControllerManager()
        self.use_client(self.limits)
        self._dropped: set[Any] = set()

    def requeue_failed(self, key: Any) -> None:
        """``handleErr``: requeued rate limited while it has failed fewer than ``maxRetries`` (15)
        times, then dropped out of the queue until an event brings it back (upstream's informers
        resync only every 12 to 24 hours)."""
        if self.retries.num_requeues(key) < MAX_RETRIES:
            super().requeue_failed(key)
            return
        self.log.warning("dropping deployment out of the queue", extra={"key": str(key)})
        self.retries.forget(key)
        self._dropped.add(key)

    def resync(self) -> None:
        for obj in self.informer.list(self.primary):
            key = base.key_of(obj)
            if not self._in_backoff(key) and key not in self._dropped:
                self.queue.add(key)

    def _mutate(self, resource: str, name: str, namespace: str, fn: Any) -> dict[str, Any]:
        """``store.mutate`` as the controller's client sends it: where ``fn`` changes the object,
        after the rate limit lets the request go (none where nothing would change)."""
        probe = self.store.get(resource, name, namespace)
        before = copy.deepcopy(probe)
        fn(probe)
        if probe == before:
            return before  # type: ignore[no-any-return]
        self.request()
        result: dict[str, Any] = self.store.mutate(resource, name, namespace, fn)
        return result

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "deployments":
            self.queue.add(base.key_of(obj))
        elif resource == "replicasets":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "Deployment":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))
            elif ref is None and not obj["metadata"].get("deletionTimestamp"):
                self._wake_adopters(obj)  # addReplicaSet/updateReplicaSet: getDeploymentsForReplicaSet

    def _wake_adopters(self, rs: dict[str, Any]) -> None:
        from spotguard_sim import scheduler

        ns = rs["metadata"].get("namespace", "")
        labels = rs["metadata"].get("labels") or {}
        for d in self.informer.list("deployments", ns):
            if scheduler.match_label_selector((d.get("spec") or {}).get("selector"), labels):
                self.queue.add(base.key_of(d))

    def _replicasets(self, deploy: dict[str, Any]) -> list[dict[str, Any]]:
        ns = deploy["metadata"].get("namespace", "default")
        uid = deploy["metadata"]["uid"]
        self._adopt_orphans(deploy)
        found = [rs for rs in self.informer.list("replicasets", ns) if base.controller_uid(rs) == uid]
        return sorted(found, key=lambda rs: (rs["metadata"].get("creationTimestamp", ""),
                                             rs["metadata"]["name"]))

    def _adopt_orphans(self, deploy: dict[str, Any]) -> None:
        """``ClaimReplicaSets`` (pkg/controller/controller_ref_manager.go, ``claimObject``): a
        ReplicaSet with no controller reference, not being deleted, whose own labels (not its
        template's) match the Deployment's selector is adopted: a controller reference to the
        Deployment is added. A ReplicaSet whose controller is another object is left alone."""
        from spotguard_sim import scheduler

        if deploy["metadata"].get("deletionTimestamp"):
            return
        ns = deploy["metadata"].get("namespace", "default")
        selector = (deploy.get("spec") or {}).get("selector")
        ref = base.owner_reference(deploy, "Deployment")
        for rs in self.informer.list("replicasets", ns):
            meta = rs["metadata"]
            if base.controller_ref(rs) is not None or meta.get("deletionTimestamp"):
                continue
            if not scheduler.match_label_selector(selector, meta.get("labels") or {}):
                continue

            def adopt(obj: dict[str, Any]) -> None:
                if base.controller_ref(obj) is None:
                    obj["metadata"]["ownerReferences"] = [*(obj["metadata"].get("ownerReferences") or []), ref]

            with contextlib.suppress(errors.NotFound):
                self._mutate("replicasets", meta["name"], ns, adopt)

    def sync(self, key: Any) -> None:
        self._dropped.discard(key)  # an event brought it back
        ns, name = key
        try:
            deploy = self.store.get("deployments", name, ns)
        except errors.NotFound:
            return
        if deploy["metadata"].get("deletionTimestamp"):
            return
        rses = self._replicasets(deploy)
        template = (deploy.get("spec") or {}).get("template") or {}
        new_rs = next((rs for rs in rses if _without_hash(rs["spec"]["template"]) == template), None)
        old = [rs for rs in rses if rs is not new_rs]
        spec = deploy.get("spec") or {}
        if new_rs is not None and old and _revision(new_rs) <= max(_revision(rs) for rs in old):
            new_rs = self._promote(deploy, new_rs, old)  # rollout undo to an old template
        if not spec.get("paused") and self._scaling_event(deploy, [*old, *([new_rs] if new_rs else [])]):
            self._proportional(deploy, new_rs, old)
            rses = self._replicasets(deploy)
            new_rs = next((rs for rs in rses if _without_hash(rs["spec"]["template"]) == template), None)
            old = [rs for rs in rses if rs is not new_rs]
        if not spec.get("paused"):
            if ((spec.get("strategy") or {}).get("type") or "RollingUpdate") == "Recreate":
                new_rs = self._recreate(deploy, new_rs, old)
            else:
                new_rs = self._rolling(deploy, new_rs, old)
            self._cleanup(deploy, old)
        self._update_status(deploy, new_rs, self._replicasets(deploy))

    # ---- rollout -------------------------------------------------------------

    def _promote(self, deploy: dict[str, Any], rs: dict[str, Any], old: list[dict[str, Any]]
                 ) -> dict[str, Any]:
        """An old ReplicaSet whose template is the Deployment's again (``kubectl rollout undo``)
        becomes the newest revision (SetNewReplicaSetAnnotations)."""
        revision = max(_revision(r) for r in old) + 1
        previous = str(_revision(rs))

        def edit(obj: dict[str, Any]) -> None:
            ann = obj["metadata"].setdefault("annotations", {})
            history = [h for h in ann.get(REVISION_HISTORY, "").split(",") if h]
            ann[REVISION_HISTORY] = ",".join([*history, previous])
            ann[REVISION] = str(revision)

        promoted: dict[str, Any] = self._mutate("replicasets", rs["metadata"]["name"],
                                                     rs["metadata"]["namespace"], edit)

        def annotate(obj: dict[str, Any]) -> None:
            obj["metadata"].setdefault("annotations", {})[REVISION] = str(revision)

        self._mutate("deployments", deploy["metadata"]["name"], deploy["metadata"]["namespace"], annotate)
        return promoted

    @staticmethod
    def _scaling_event(deploy: dict[str, Any], rses: list[dict[str, Any]]) -> bool:
        """isScalingEvent: an active ReplicaSet was sized for another replica count."""
        replicas = _spec_replicas(deploy)
        for rs in rses:
            if _spec_replicas(rs) == 0:
                continue
            desired = ((rs["metadata"].get("annotations") or {}).get(DESIRED))
            if desired is not None and desired.isdigit() and int(desired) != replicas:
                return True
        return False

    def _proportional(self, deploy: dict[str, Any], new_rs: dict[str, Any] | None,
                      old: list[dict[str, Any]]) -> None:
        """The Deployment was scaled during a rollout: spread the change over the active
        ReplicaSets in proportion to their sizes (sync.go scale / GetProportion), the
        leftover to the largest; with a single active one, it takes the whole change."""
        replicas = _spec_replicas(deploy)
        active = [rs for rs in [*([new_rs] if new_rs else []), *old] if _spec_replicas(rs) > 0]
        if len(active) <= 1:
            for rs in active:
                if _spec_replicas(rs) != replicas:
                    self._scale(rs, replicas, deploy)
            return
        surge, _ = surge_and_unavailable(deploy)
        allowed = replicas + surge
        to_add = allowed - sum(_spec_replicas(rs) for rs in active)
        # larger first; on scale up newer first, on scale down older first
        active.sort(key=lambda rs: (-_spec_replicas(rs), rs["metadata"].get("creationTimestamp", "")),
                    reverse=False)
        if to_add > 0:
            active.sort(key=lambda rs: (-_spec_replicas(rs), _newest_first(rs)))
        sizes: dict[str, int] = {}
        added = 0
        for rs in active:
            annotated = (rs["metadata"].get("annotations") or {}).get(MAX_REPLICAS, "")
            base_size = int(annotated) if annotated.isdigit() and int(annotated) > 0 else max(
                sum(_spec_replicas(r) for r in active), 1)
            count = _spec_replicas(rs)
            # integer.RoundToInt32(count * allowed / annotated) - count (math.Round: half away from 0)
            fraction = -count if replicas == 0 else (2 * count * allowed + base_size) // (2 * base_size) - count
            share = min(fraction, to_add - added) if to_add > 0 else max(fraction, to_add - added)
            sizes[rs["metadata"]["name"]] = count + share
            added += share
        if active and added != to_add:
            first = active[0]["metadata"]["name"]
            sizes[first] = max(0, sizes[first] + to_add - added)
        for rs in active:
            size = max(0, sizes[rs["metadata"]["name"]])
            self._scale(rs, size, deploy)

    def _rolling(
        self, deploy: dict[str, Any], new_rs: dict[str, Any] | None, old: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        replicas = _spec_replicas(deploy)
        surge, unavailable = surge_and_unavailable(deploy)
        all_rs = [*old, *([new_rs] if new_rs else [])]
        current = sum(_spec_replicas(rs) for rs in all_rs)
        # reconcileNewReplicaSet
        new_count = _spec_replicas(new_rs) if new_rs else 0
        if new_count > replicas:
            target = replicas
        elif new_count < replicas:
            room = replicas + surge - current
            target = new_count + max(0, min(room, replicas - new_count))
        else:
            target = new_count
        if new_rs is None:
            new_rs = self._create_rs(deploy, target, old)
            if new_rs is None:
                return None
        elif target != new_count:
            new_rs = self._scale(new_rs, target, deploy)
        # reconcileOldReplicaSets
        old_pods = sum(_spec_replicas(rs) for rs in old)
        if old_pods == 0:
            return new_rs
        all_pods = old_pods + _spec_replicas(new_rs)
        min_available = replicas - unavailable
        new_unavailable = _spec_replicas(new_rs) - _status(new_rs, "availableReplicas")
        max_scaled_down = all_pods - min_available - new_unavailable
        if max_scaled_down <= 0:
            return new_rs
        # cleanupUnhealthyReplicas: old pods that are not available go first
        cleaned = 0
        for i, rs in enumerate(old):
            if cleaned >= max_scaled_down:
                break
            unhealthy = _spec_replicas(rs) - _status(rs, "availableReplicas")
            if unhealthy <= 0:
                continue
            down = min(max_scaled_down - cleaned, unhealthy)
            old[i] = self._scale(rs, _spec_replicas(rs) - down, deploy)
            cleaned += down
        # scaleDownOldReplicaSetsForRollingUpdate
        available = sum(_status(rs, "availableReplicas") for rs in [*old, new_rs])
        if available <= min_available:
            return new_rs
        total = min(available - min_available, max_scaled_down - cleaned)
        for i, rs in enumerate(old):
            if total <= 0:
                break
            count = _spec_replicas(rs)
            if count == 0:
                continue
            down = min(count, total)
            old[i] = self._scale(rs, count - down, deploy)
            total -= down
        return new_rs

    def _recreate(
        self, deploy: dict[str, Any], new_rs: dict[str, Any] | None, old: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        active = [rs for rs in old if _spec_replicas(rs) > 0]
        for rs in active:
            self._scale(rs, 0, deploy)
        if active:
            return new_rs
        # wait until no pod of an old ReplicaSet is left (oldPodsRunning)
        for rs in old:
            if self.informer.pods_owned_by(rs["metadata"]["uid"]):
                return new_rs
        replicas = _spec_replicas(deploy)
        if new_rs is None:
            return self._create_rs(deploy, replicas, old)
        if _spec_replicas(new_rs) != replicas:
            return self._scale(new_rs, replicas, deploy)
        return new_rs

    def _cleanup(self, deploy: dict[str, Any], old: list[dict[str, Any]]) -> None:
        limit = int((deploy.get("spec") or {}).get("revisionHistoryLimit", 10))
        idle = [rs for rs in old if _spec_replicas(rs) == 0 and _status(rs, "replicas") == 0]
        for rs in idle[: max(0, len(idle) - limit)]:
            with contextlib.suppress(errors.NotFound):
                self.store.delete("replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"])

    def _scale(self, rs: dict[str, Any], replicas: int, deploy: dict[str, Any]) -> dict[str, Any]:
        surge, _ = surge_and_unavailable(deploy)
        desired = _spec_replicas(deploy)

        def edit(obj: dict[str, Any]) -> None:
            obj["spec"]["replicas"] = replicas
            ann = obj["metadata"].setdefault("annotations", {})
            ann[DESIRED] = str(desired)
            ann[MAX_REPLICAS] = str(desired + surge)

        self.log.info("scaling replicaset", extra={
            "replicaset": rs["metadata"]["name"], "namespace": rs["metadata"]["namespace"],
            "from": _spec_replicas(rs), "to": replicas})
        result: dict[str, Any] = self._mutate(
            "replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"], edit
        )
        before = _spec_replicas(rs)
        if before != replicas:
            self.event(deploy, "Normal", "ScalingReplicaSet", f"Scaled {'up' if replicas > before else 'down'} "
                       f"replica set {rs['metadata']['name']} from {before} to {replicas}")
        return result

    def _create_rs(
        self, deploy: dict[str, Any], replicas: int, old: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        meta = deploy["metadata"]
        ns = meta.get("namespace", "default")
        spec = deploy.get("spec") or {}
        collisions = (deploy.get("status") or {}).get("collisionCount")
        template = copy.deepcopy(spec.get("template") or {})
        pod_hash = template_hash(template, collisions)
        template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = pod_hash
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = pod_hash
        revision = max((_revision(rs) for rs in old), default=0) + 1
        surge, _ = surge_and_unavailable(deploy)
        desired = _spec_replicas(deploy)
        rs_name = f"{meta['name']}-{pod_hash}"
        rs: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": rs_name,
                "namespace": ns,
                "labels": dict(template["metadata"]["labels"]),
                "annotations": {
                    REVISION: str(revision),
                    DESIRED: str(desired),
                    MAX_REPLICAS: str(desired + surge),
                },
                "ownerReferences": [base.owner_reference(deploy, "Deployment")],
            },
            "spec": {
                "replicas": replicas,
                "minReadySeconds": int(spec.get("minReadySeconds") or 0),
                "selector": selector,
                "template": template,
            },
        }
        try:
            self.request()
            created: dict[str, Any] = self.store.create("replicasets", rs, namespace=ns)
        except errors.AlreadyExists:
            existing = self.store.get("replicasets", rs_name, ns)
            if base.controller_uid(existing) == meta["uid"] and _without_hash(
                existing["spec"]["template"]
            ) == spec.get("template"):
                return existing  # type: ignore[no-any-return]
            # a hash collision: bump collisionCount and try again on the next sync
            def bump(obj: dict[str, Any]) -> None:
                status = obj.setdefault("status", {})
                status["collisionCount"] = int(status.get("collisionCount") or 0) + 1

            self._mutate("deployments", meta["name"], ns, bump)
            return None
        self.log.info("created replicaset", extra={
            "deployment": meta["name"], "namespace": ns, "replicaset": rs_name,
            "replicas": replicas})
        self.event(deploy, "Normal", "ScalingReplicaSet", f"Scaled up replica set {rs_name} from 0 to {replicas}")

        def annotate(obj: dict[str, Any]) -> None:
            obj["metadata"].setdefault("annotations", {})[REVISION] = str(revision)

        self._mutate("deployments", meta["name"], ns, annotate)
        return created

    # ---- status ----------------------------------------------------------------

    def _update_status(
        self, deploy: dict[str, Any], new_rs: dict[str, Any] | None, rses: list[dict[str, Any]]
    ) -> None:
        replicas = _spec_replicas(deploy)
        _, unavailable = surge_and_unavailable(deploy)
        total = sum(_status(rs, "replicas") for rs in rses)
        ready = sum(_status(rs, "readyReplicas") for rs in rses)
        available = sum(_status(rs, "availableReplicas") for rs in rses)
        updated = 0
        if new_rs is not None:
            current = next((rs for rs in rses if rs["metadata"]["uid"] == new_rs["metadata"]["uid"]), new_rs)
            updated = _status(current, "replicas")
        status: dict[str, Any] = {
            "observedGeneration": deploy["metadata"].get("generation", 1),
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            # calculateStatus: the ReplicaSets' desired replicas minus the available ones
            "unavailableReplicas": max(0, sum(_spec_replicas(rs) for rs in rses) - available),
        }
        now = self.clock.iso()
        is_available = available >= replicas - unavailable
        complete = updated == replicas and available == replicas and total == replicas
        rs_name = new_rs["metadata"]["name"] if new_rs else ""
        wanted: dict[str, tuple[str, str, str]] = {
            "Available": (
                "True" if is_available else "False",
                "MinimumReplicasAvailable" if is_available else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if is_available else "Deployment does not have minimum availability.",
            ),
            "Progressing": (
                "True",
                "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                f'ReplicaSet "{rs_name}" has successfully progressed.'
                if complete else f'ReplicaSet "{rs_name}" is progressing.',
            ),
        }

        def edit(obj: dict[str, Any]) -> None:
            old = obj.get("status") or {}
            conds = {c.get("type"): c for c in old.get("conditions") or []}
            out = []
            for kind, (st, reason, message) in wanted.items():
                prev = conds.get(kind)
                if prev and prev.get("status") == st and prev.get("reason") == reason:
                    out.append(prev)
                    continue
                transition = prev.get("lastTransitionTime") if prev and prev.get("status") == st else now
                out.append({"type": kind, "status": st, "lastUpdateTime": now,
                            "lastTransitionTime": transition, "reason": reason, "message": message})
            new_status = {k: v for k, v in status.items() if v or k == "observedGeneration"}
            if "collisionCount" in old:
                new_status["collisionCount"] = old["collisionCount"]
            new_status["conditions"] = out
            obj["status"] = new_status
            if new_rs is not None:
                obj["metadata"].setdefault("annotations", {})[REVISION] = str(_revision(new_rs))

        self._mutate("deployments", deploy["metadata"]["name"], deploy["metadata"]["namespace"], edit)
