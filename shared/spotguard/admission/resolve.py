"""From a pod to its workload: Pod -> ReplicaSet -> Deployment, or Pod -> StatefulSet.

Lookups go through the gateway and an in-process TTL cache, so a long-lived
process (the local server, a Knative instance, a warm Lambda) does not ask
the API for the same ReplicaSet once per pod:

* a ReplicaSet is cached for ``owner_ttl`` (its owner and selector never change);
* a Deployment or StatefulSet for ``workload_ttl`` (its replicas and
  annotations do change; a short TTL bounds how stale a floor can be);
* a namespace's annotations for ``namespace_ttl`` (the opt-out switch);
* the node -> capacity map for ``node_ttl``, refreshed early (at most every
  ``node_refresh`` seconds) when a pod sits on a node the map does not know.

A cached workload can be older than a change that creates pods: the
spot-interruption handler's surge (``spec.replicas`` and the
``spotguard.io/surge`` record in one patch) or a scale, within ``workload_ttl``
of the last admission. The pods of that change must not be decided on the
old floor, so the cache is bypassed (:meth:`Resolver.refresh_workload`) when
the pod itself is evidence that the cached copy is older than it:

* a workload cached at 0 replicas (a pod is being created, so it has grown);
* a StatefulSet pod whose ordinal is at or beyond the cached replica count;
* a Deployment pod that would make the ReplicaSet hold more pods than the
  cached ``spec.replicas``: the pods known to the reservation Lease (the last
  count, the reservations since, and this process's own spot admissions since)
  plus this pod. :meth:`Reservations.claim
  <spotguard.admission.reservations.Reservations.claim>` applies this rule.

``Resolved.fresh`` says the workload was read from the API during this
resolve (then there is nothing to bypass). A burst that creates the pods of
the cached scale never trips the rule, so the common case costs nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from spotguard.admission import deadline
from spotguard.gateway import errors as gateway_errors
from spotguard.gateway import resources as r
from spotguard.gateway import settings
from spotguard.policy import surgecopy
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.interruption import selector_matches
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import Workload, surge_copy_name

Obj = dict[str, Any]
_MISSING = object()
# A read the API server did not answer in time (the review's deadline, a timeout, a 5xx, a
# 429) falls back to the object as last read, when it was read at most this long ago
LAST_KNOWN_SECONDS = 60.0
UNANSWERED: tuple[type[BaseException], ...] = (deadline.DeadlineExceeded, *gateway_errors.RETRY_LATER)
POD_TEMPLATE_HASH = "pod-template-hash"
# How long a workload read is kept (``$SPOTGUARD_WORKLOAD_CACHE_SECONDS``; node-added's moves
# wait for it: spotguard.nodeadded.reconciler.ADMISSION_CACHE_SECONDS).
WORKLOAD_TTL_SECONDS = settings.WORKLOAD_CACHE_SECONDS
log = logging.getLogger(__name__)


class TTLCache:
    """A small thread-safe map whose entries expire."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = 10_000) -> None:
        self._clock = clock
        self._max = max_entries
        self._data: dict[Any, tuple[float, Any]] = {}
        self._last: dict[Any, tuple[float, Any]] = {}  # key -> (when put, value): what was last read
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return _MISSING
            expires, value = hit
            if expires < self._clock():
                del self._data[key]
                return _MISSING
            return value

    def put(self, key: Any, value: Any, ttl: float) -> None:
        with self._lock:
            if len(self._data) >= self._max:
                now = self._clock()
                for k in [k for k, (exp, _) in self._data.items() if exp < now]:
                    del self._data[k]
                if len(self._data) >= self._max:
                    self._data.clear()
            self._data[key] = (self._clock() + ttl, value)
            if value is not None:
                if len(self._last) >= self._max:
                    self._last.clear()
                self._last[key] = (self._clock(), value)

    def last(self, key: Any, max_age: float) -> Any:
        """The value last put under ``key`` (expired or not) if put at most ``max_age`` ago."""
        with self._lock:
            hit = self._last.get(key)
            if hit is None or self._clock() - hit[0] > max_age:
                return _MISSING
            return hit[1]

    def pop(self, key: Any) -> None:
        """Forget the entry (``last`` still has it: a read to replace it may not be answered)."""
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._last.clear()


@dataclass(frozen=True)
class Resolved:
    """A pod's workload, the API object behind it (for Events), and its ReplicaSet if any."""

    workload: Workload
    obj: Obj
    replicaset: Obj | None = None
    fresh: bool = False  # the workload was read from the API for this pod (not from the cache)

    @property
    def replicaset_uid(self) -> str:
        return str(((self.replicaset or {}).get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True)
class Unresolved:
    reason: str


def deployment_name(pod: PodView) -> str | None:
    """The Deployment a pod's ReplicaSet most likely belongs to, by the name the ReplicaSet
    controller gives a ReplicaSet (``<deployment>-<pod-template-hash>``); None where the pod
    is not owned by a ReplicaSet so named. A guess: the caller checks the Deployment."""
    owner = pod.owner
    suffix = "-" + pod.labels.get(POD_TEMPLATE_HASH, "")
    if owner is None or owner.kind != "ReplicaSet" or suffix == "-" or not owner.name.endswith(suffix):
        return None
    return owner.name[: -len(suffix)] or None


class Resolver:
    def __init__(
        self,
        kube: Any,  # a gateway Kube, or admission's DeadlineKube around one
        *,
        clock: Callable[[], float] = time.monotonic,
        owner_ttl: float = 300.0,
        workload_ttl: float = WORKLOAD_TTL_SECONDS,
        namespace_ttl: float = 30.0,
        node_ttl: float = 60.0,
        node_refresh: float = 5.0,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.owner_ttl = owner_ttl
        self.workload_ttl = workload_ttl
        self.namespace_ttl = namespace_ttl
        self.node_ttl = node_ttl
        self.node_refresh = node_refresh
        self.cache = TTLCache(clock)
        self._nodes_lock = threading.Lock()
        self._nodes: dict[str, NodeView] = {}
        self._nodes_at = -1e18
        self._nodes_retry = -1e18  # after a failed refresh: not before this
        self._flights: dict[Any, futures.Future[Obj | None]] = {}  # reads in progress, shared
        self._flights_lock = threading.Lock()

    # -- lookups ---------------------------------------------------------------------

    def _get(self, res: r.Resource, name: str, namespace: str | None, ttl: float, *, join: bool = True) -> Obj | None:
        return self._lookup(res, name, namespace, ttl, join=join)[0]

    def _lookup(
        self, res: r.Resource, name: str, namespace: str | None, ttl: float, *, join: bool = True
    ) -> tuple[Obj | None, bool]:
        """The object (None: not found) and whether it was read from the API just now.

        Reviews that miss the cache together share one read (the first one's): a burst
        of a workload's pods, or every review once a namespace's entry expired, makes one
        GET, not one each. A waiter's answer counts as cached (not read for it). ``join``
        False starts a read of its own (a refresh must not take an older read's answer).
        """
        key = (res.plural, namespace, name)
        hit = self.cache.get(key)
        if hit is not _MISSING:
            return hit, False
        with self._flights_lock:
            flight = self._flights.get(key) if join else None
            if flight is None:
                mine: futures.Future[Obj | None] = futures.Future()
                self._flights[key] = mine
        if flight is not None:
            try:
                return flight.result(timeout=max(0.0, deadline.remaining(30.0))), False
            except futures.TimeoutError:
                late = deadline.DeadlineExceeded(f"waiting for a shared read of {res.plural} {name}")
                return self._last_known(key, late)
            except UNANSWERED as exc:
                return self._last_known(key, exc)
        try:
            obj = self.kube.find(res, name, namespace)
        except UNANSWERED as exc:
            mine.set_exception(exc)
            return self._last_known(key, exc)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            self.cache.put(key, obj, ttl if obj is not None else min(ttl, 2.0))
            mine.set_result(obj)
        finally:
            with self._flights_lock:
                if self._flights.get(key) is mine:
                    del self._flights[key]
        return obj, True

    def _last_known(self, key: Any, exc: BaseException) -> tuple[Obj | None, bool]:
        """A read the API server did not answer in time: the object as last read, if it was
        read at most ``LAST_KNOWN_SECONDS`` ago and the caller takes such answers (a pod's
        placement review, whose answer is then a degraded one: ``deadline.note``; never the
        eviction guard), else the error."""
        last = self.cache.last(key, LAST_KNOWN_SECONDS)
        if last is _MISSING or not deadline.note("stale_read"):
            raise exc
        log.info("read not answered in time; using the copy last read", extra={"object": "/".join(map(str, key))})
        return last, False

    def has_namespace(self, namespace: str) -> bool:
        """Whether the namespace's annotations are cached (no API call needed)."""
        return self.cache.get((r.NAMESPACES.plural, None, namespace)) is not _MISSING

    def has_nodes(self) -> bool:
        """Whether the node list is fresh, or a refresh failed a moment ago (no API call needed)."""
        now = self.clock()
        return now - self._nodes_at <= self.node_ttl or (bool(self._nodes) and now < self._nodes_retry)

    def forget(self, res: r.Resource, name: str, namespace: str | None) -> None:
        self.cache.pop((res.plural, namespace, name))

    def namespace_annotations(self, namespace: str) -> Mapping[str, str]:
        ns = self._get(r.NAMESPACES, namespace, None, self.namespace_ttl)
        return dict(((ns or {}).get("metadata") or {}).get("annotations") or {})

    def cached_replicaset(self, pod: PodView) -> Obj | None:
        """The pod's ReplicaSet when the cache holds it (no API call), else None."""
        owner = pod.owner
        if owner is None or owner.kind != "ReplicaSet":
            return None
        hit = self.cache.get((r.REPLICASETS.plural, pod.namespace, owner.name))
        if hit is _MISSING or hit is None or not _uid_matches(hit, owner.uid):
            return None
        return hit  # type: ignore[no-any-return]

    def prefetch_deployment(self, pod: PodView, pool: futures.Executor) -> None:
        """Start reading the Deployment a Deployment's pod most likely belongs to, while its
        ReplicaSet is read: the ReplicaSet controller names a ReplicaSet ``<deployment>-<pod-
        template-hash>``, so a cold review's two sequential reads (ReplicaSet, then its
        Deployment) overlap. :meth:`resolve` joins the read (or finds it cached) and checks
        it against the ReplicaSet's owner reference as always; a wrong guess costs one GET."""
        name = deployment_name(pod)
        if name is None:
            return
        key = (r.DEPLOYMENTS.plural, pod.namespace, name)
        if self.cache.get(key) is not _MISSING:
            return
        with self._flights_lock:
            if key in self._flights:
                return
        deadline.submit(pool, self._quiet_get, r.DEPLOYMENTS, key[2], pod.namespace, self.workload_ttl)

    def replicaset_hint(self, pod: PodView) -> Obj | None:
        """What counting a Deployment pod's siblings needs of its ReplicaSet, from the pod alone:
        the owner reference's name and uid, and a selector on the pod's ``pod-template-hash``
        (every pod of the ReplicaSet carries it; the count keeps only pods owned by that uid)."""
        owner = pod.owner
        digest = pod.labels.get(POD_TEMPLATE_HASH)
        if owner is None or owner.kind != "ReplicaSet" or not owner.uid or not digest:
            return None
        return {
            "metadata": {"name": owner.name, "namespace": pod.namespace, "uid": owner.uid},
            "spec": {"selector": {"matchLabels": {POD_TEMPLATE_HASH: digest}}},
        }

    def _by_name(self, pod: PodView) -> Resolved | None:
        """A placement review whose pod's ReplicaSet could not be read in time: its Deployment
        by the name the ReplicaSet controller gives a ReplicaSet (``<deployment>-<pod-template-
        hash>``), when that Deployment's selector takes the pod (a degraded answer,
        ``deadline.note``). None: no such Deployment known, or the eviction guard asking."""
        hint, name = self.replicaset_hint(pod), deployment_name(pod)
        if hint is None or name is None or not deadline.collecting():
            return None
        try:
            dep = self._get(r.DEPLOYMENTS, name, pod.namespace, self.workload_ttl)
        except UNANSWERED:
            return None
        if dep is None or not selector_matches((dep.get("spec") or {}).get("selector"), pod.labels):
            return None
        deadline.note("by_name")
        return Resolved(Workload.from_json(_typed(dep, "Deployment")), dep, hint)

    def _quiet_get(self, res: r.Resource, name: str, namespace: str, ttl: float) -> None:
        try:
            self._get(res, name, namespace, ttl)
        except Exception:  # a prefetch only: the review that needs it reads again and reports
            log.debug("prefetch failed", exc_info=True)

    def replicaset_of(self, pod: PodView) -> Obj | None:
        """The pod's ReplicaSet (cached), or None when its owner is something else."""
        owner = pod.owner
        if owner is None or owner.kind != "ReplicaSet":
            return None
        rs = self._get(r.REPLICASETS, owner.name, pod.namespace, self.owner_ttl)
        if rs is None or not _uid_matches(rs, owner.uid):
            return None
        return rs

    def resolve(self, pod: PodView) -> Resolved | Unresolved:
        owner = pod.owner
        if owner is None:
            return Unresolved("bare pod (no controller)")
        if owner.kind == "StatefulSet":
            sts, fresh = self._lookup(r.STATEFULSETS, owner.name, pod.namespace, self.workload_ttl)
            if sts is None or not _uid_matches(sts, owner.uid):
                return Unresolved(f"StatefulSet {pod.namespace}/{owner.name} not found")
            return Resolved(Workload.from_json(_typed(sts, "StatefulSet")), sts, fresh=fresh)
        if owner.kind != "ReplicaSet":
            return Unresolved(f"owned by a {owner.kind}")
        try:
            rs = self._get(r.REPLICASETS, owner.name, pod.namespace, self.owner_ttl)
        except UNANSWERED:
            by_name = self._by_name(pod)
            if by_name is None:
                raise
            return by_name
        if rs is not None and not _uid_matches(rs, owner.uid):
            # A ReplicaSet deleted and re-created under the same name: read it again.
            self.forget(r.REPLICASETS, owner.name, pod.namespace)
            rs = self._get(r.REPLICASETS, owner.name, pod.namespace, self.owner_ttl)
        if rs is None or not _uid_matches(rs, owner.uid):
            return Unresolved(f"ReplicaSet {pod.namespace}/{owner.name} not found")
        dep_ref = controller_ref(rs)
        if dep_ref is None or dep_ref.get("kind") != "Deployment":
            return Unresolved("ReplicaSet without a Deployment")
        dep, fresh = self._lookup(r.DEPLOYMENTS, str(dep_ref.get("name")), pod.namespace, self.workload_ttl)
        if dep is None or not _uid_matches(dep, str(dep_ref.get("uid") or "")):
            return Unresolved(f"Deployment {pod.namespace}/{dep_ref.get('name')} not found")
        return Resolved(Workload.from_json(_typed(dep, "Deployment")), dep, rs, fresh)

    def deployment(self, namespace: str, name: str) -> Resolved | Unresolved:
        """The Deployment ``name`` in ``namespace`` (cached as :meth:`resolve`'s): a surge
        copy's pods name theirs by label (``spotguard.policy.surgecopy``), no ReplicaSet of it
        owns them. No uid to check: a replace (``--force``) re-creates the Deployment, and its
        copy serves the new one."""
        dep, fresh = self._lookup(r.DEPLOYMENTS, name, namespace, self.workload_ttl)
        if dep is None:
            return Unresolved(f"Deployment {namespace}/{name} not found")
        return Resolved(Workload.from_json(_typed(dep, "Deployment")), dep, fresh=fresh)

    def surge_copy(self, namespace: str, deployment: str, *, fresh: bool = False) -> Obj | None:
        """The surge copy of the Deployment ``deployment`` (``spotguard.policy.surgecopy``: it
        carries the surge's record; the Deployment carries none), cached as a workload is;
        None where there is none (or a ReplicaSet so named is not its copy). ``fresh``: read
        now, not from the cache (the eviction guard: the record changes with each write of
        the copy); the answer is cached for the reviews after."""
        name = surge_copy_name(deployment)
        if fresh:
            self.forget(r.REPLICASETS, name, namespace)
        rs = self._get(r.REPLICASETS, name, namespace, self.workload_ttl, join=not fresh)
        return rs if rs is not None and surgecopy.copy_of(rs) == deployment else None

    def refresh_workload(self, resolved: Resolved) -> Resolved:
        """Read the workload again, bypassing the cache (its replicas may be newer)."""
        if resolved.fresh:
            return resolved
        w = resolved.workload
        res = r.DEPLOYMENTS if w.kind.value == "Deployment" else r.STATEFULSETS
        self.forget(res, w.name, w.namespace)
        obj, fresh = self._lookup(res, w.name, w.namespace, self.workload_ttl, join=False)
        if obj is None or not _uid_matches(obj, w.uid or ""):
            return resolved
        # (not fresh: the read was not answered in time and the copy last read came back)
        return Resolved(Workload.from_json(_typed(obj, w.kind.value)), obj, resolved.replicaset, fresh)

    # -- nodes -----------------------------------------------------------------------

    def nodes(self, wanted: Iterable[str] = (), max_age: float | None = None) -> list[NodeView]:
        """Every node (labels, taints), from a cached list refreshed when a node is new
        (or older than ``max_age``).

        A refresh that fails (a slow or overloaded API server) keeps the last list and is
        tried again ``node_refresh`` seconds later: without this, every review behind it
        listed every node again, one after another, each timing out (a 1,000-node cluster
        under a burst: thousands of LISTs and as many reviews failed open)."""
        wanted = [n for n in wanted if n]
        with self._nodes_lock:
            now = self.clock()
            age = now - self._nodes_at
            unknown = any(n not in self._nodes for n in wanted)
            stale = max_age is not None and age > max_age
            due = age > self.node_ttl or stale or (unknown and age > self.node_refresh)
            if due and (not self._nodes or now >= self._nodes_retry):
                try:
                    raw = self.kube.list(r.NODES)
                except Exception as exc:
                    if not self._nodes:
                        raise
                    self._nodes_retry = self.clock() + self.node_refresh
                    log.warning(
                        "listing the nodes failed; using the last list", extra={"error": str(exc)[:200]}
                    )
                else:
                    self._nodes = {v.name: v for v in (NodeView.from_json(n) for n in raw)}
                    self._nodes_at = self.clock()
            return list(self._nodes.values())

    def node_capacity(self, config: Config, wanted: Iterable[str] = ()) -> dict[str, Capacity]:
        """Capacity of every node, from the cached node list."""
        return {n.name: config.node_capacity(n.labels) for n in self.nodes(wanted)}


def label_selector(match: Mapping[str, str]) -> str | None:
    """``matchLabels`` as a LIST's ``labelSelector`` (None: no selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(match.items())) or None


def _uid_matches(obj: Mapping[str, Any], uid: str) -> bool:
    return not uid or str((obj.get("metadata") or {}).get("uid") or "") == uid


def controller_ref(obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The owner reference of ``obj``'s controller, if any."""
    for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def _typed(obj: Obj, kind: str) -> Obj:
    if obj.get("kind") == kind:
        return obj
    return {**obj, "kind": kind, "apiVersion": "apps/v1"}
