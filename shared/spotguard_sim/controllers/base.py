"""The controller machinery: a client-go style work queue, a shared informer
cache fed by ``store.subscribe``, and a base class with worker threads and a
periodic resync. Times are simulated seconds (``store.clock``)."""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from spotguard_sim import errors
from spotguard_sim.controllers import ratelimit

Key = tuple[str, str]
MIN_RESYNC_REAL_SECONDS = 1.0  # a safety net; events and timers do the real work
COALESCE_SECONDS = 0.05  # real seconds over which dependent events are batched
MAX_DELAY_WAIT = 0.5  # real seconds: a delayed key's wait is measured again (the clock's scale may change)
ObjList = list[dict[str, Any]]
log = logging.getLogger("spotguard.sim.controllers")


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def rv_of(obj: dict[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class WorkQueue:
    """Deduplicating queue: a key is never processed by two workers at once;
    a key added while being processed is processed again afterwards."""

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._delayed: list[tuple[float, int, Hashable, bool]] = []
        self._waiting: dict[Hashable, float] = {}  # key -> when its add_after makes it ready
        self._seq = itertools.count()
        self._shutdown = False
        self._coalescing: set[Hashable] = set()

    def _add_locked(self, key: Hashable) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add(self, key: Hashable) -> None:
        with self._cond:
            if not self._shutdown:
                self._add_locked(key)

    def add_after(self, key: Hashable, sim_seconds: float) -> None:
        """Add ``key`` once ``sim_seconds`` have passed; a key already waiting keeps the earlier
        of the two times, as client-go's delaying queue (one entry per key)."""
        if sim_seconds <= 0:
            self.add(key)
            return
        due = self._clock.now() + sim_seconds
        with self._cond:
            if self._shutdown:
                return
            waiting = self._waiting.get(key)
            if waiting is not None and waiting <= due:
                return
            self._waiting[key] = due
            heapq.heappush(self._delayed, (due, next(self._seq), key, False))
            self._cond.notify()

    def add_coalesced(self, key: Hashable, real_seconds: float = COALESCE_SECONDS) -> None:
        """Add ``key`` after a short real-time window, once however often it is called
        meanwhile: a burst of pod events becomes one sync of their owner."""
        with self._cond:
            if self._shutdown or key in self._coalescing or key in self._dirty:
                return
            self._coalescing.add(key)
            due = self._clock.now() + real_seconds * self._clock.time_scale
            heapq.heappush(self._delayed, (due, next(self._seq), key, True))
            self._cond.notify()

    def get(self) -> Hashable | None:
        with self._cond:
            while True:
                now = self._clock.now()
                while self._delayed and self._delayed[0][0] <= now:
                    due, _, key, coalesced = heapq.heappop(self._delayed)
                    if coalesced:
                        self._coalescing.discard(key)
                    elif self._waiting.get(key) == due:
                        del self._waiting[key]
                    else:
                        continue  # replaced by an earlier time
                    self._add_locked(key)
                if self._shutdown:
                    return None
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                # Due times are simulated: the clock's scale may change while this waits.
                timeout = min(self._clock.real(self._delayed[0][0] - now), MAX_DELAY_WAIT) if self._delayed else None
                self._cond.wait(timeout)

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty and not self._shutdown:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)


class Informer:
    """A read cache of the store (like client-go's shared informers), with
    indexes of pods by controller owner uid and by node."""

    def __init__(self, resources: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self.objects: dict[str, dict[Key, dict[str, Any]]] = {r: {} for r in resources}
        self._deleted: dict[str, dict[Key, int]] = {r: {} for r in resources}  # tombstones
        self._by_owner: dict[str, dict[Key, dict[str, Any]]] = {}
        self._by_node: dict[str, dict[Key, dict[str, Any]]] = {}
        self._by_ns: dict[tuple[str, str], dict[Key, dict[str, Any]]] = {}

    def prime(self, store: Any) -> None:
        for resource in self.objects:
            items, _ = store.list(resource)
            for obj in items:
                with self._lock:
                    key = key_of(obj)
                    if key not in self.objects[resource] and key not in self._deleted[resource]:
                        self._put(resource, key, obj)

    def on_event(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        """Apply a notification; notifications from concurrent writers may arrive out of
        order, so an older resourceVersion never replaces a newer state (nor revives a
        deleted object)."""
        if resource not in self.objects:
            return
        key = key_of(obj)
        rv = rv_of(obj)
        with self._lock:
            old = self.objects[resource].get(key)
            if old is not None and rv_of(old) > rv:
                return
            gone = self._deleted[resource].get(key)
            if gone is not None and gone >= rv:
                return
            if event_type == "DELETED":
                if old is not None:
                    self._drop(resource, key, old)
                self._deleted[resource][key] = rv
                return
            self._deleted[resource].pop(key, None)
            self._put(resource, key, obj)

    def _put(self, resource: str, key: Key, obj: dict[str, Any]) -> None:
        old = self.objects[resource].get(key)
        if old is not None:
            self._drop(resource, key, old)
        self.objects[resource][key] = obj
        self._by_ns.setdefault((resource, key[0]), {})[key] = obj
        if resource == "pods":
            uid = controller_uid(obj)
            if uid:
                self._by_owner.setdefault(uid, {})[key] = obj
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                self._by_node.setdefault(node, {})[key] = obj

    def _drop(self, resource: str, key: Key, old: dict[str, Any]) -> None:
        self.objects[resource].pop(key, None)
        in_ns = self._by_ns.get((resource, key[0]))
        if in_ns is not None:
            in_ns.pop(key, None)
            if not in_ns:
                del self._by_ns[(resource, key[0])]
        if resource == "pods":
            uid = controller_uid(old)
            if uid and uid in self._by_owner:
                self._by_owner[uid].pop(key, None)
                if not self._by_owner[uid]:
                    del self._by_owner[uid]
            node = (old.get("spec") or {}).get("nodeName")
            if node and node in self._by_node:
                self._by_node[node].pop(key, None)
                if not self._by_node[node]:
                    del self._by_node[node]

    def get(self, resource: str, key: Key) -> dict[str, Any] | None:
        with self._lock:
            return self.objects[resource].get(key)

    def list(self, resource: str, namespace: str | None = None) -> ObjList:
        with self._lock:
            if namespace is None:
                return list(self.objects[resource].values())
            return list(self._by_ns.get((resource, namespace), {}).values())

    def pods_owned_by(self, uid: str) -> ObjList:
        with self._lock:
            return list(self._by_owner.get(uid, {}).values())

    def pods_on_node(self, node: str) -> ObjList:
        with self._lock:
            return list(self._by_node.get(node, {}).values())


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def controller_uid(obj: dict[str, Any]) -> str | None:
    ref = controller_ref(obj)
    return ref.get("uid") if ref else None


def owner_reference(owner: dict[str, Any], kind: str, api_version: str = "apps/v1") -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def service_account_user(name: str) -> dict[str, Any]:
    """The userInfo kube-controller-manager's controllers act as."""
    return {
        "username": f"system:serviceaccount:kube-system:{name}",
        "uid": f"sim-{name}",
        "groups": [
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated",
        ],
    }


class Controller:
    """Worker threads draining a work queue of keys, and a periodic resync."""

    name = "controller"
    primary = ""  # the store resource whose keys this controller syncs
    workers = 1
    resync_seconds = 30.0
    recorder: Any = None  # an events.Recorder, set by Controllers

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` (asynchronously, never failing the caller)."""
        if self.recorder is not None:
            self.recorder.record(obj, type_, reason, message, component=self.name)

    def __init__(self, store: Any, informer: Informer) -> None:
        self.store = store
        self.clock = store.clock
        self.informer = informer
        self.queue = WorkQueue(self.clock)
        self.log = logging.getLogger(f"spotguard.sim.{self.name}")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # the work queue's retry limiter (workqueue.DefaultControllerRateLimiter)
        self.retries: ratelimit.FailureRateLimiter | ratelimit.FixedIntervalRateLimiter = \
            ratelimit.FailureRateLimiter(self.clock)
        # the controller's own API client's token bucket (None: requests are not limited)
        self.client: ratelimit.TokenBucket | None = None

    def request(self) -> None:
        """Wait until the controller's client may send a request (client-go's rate limiter
        counts every request, reads included; informer reads are not requests)."""
        if self.client is not None:
            self.client.wait(self._stop)

    def use_client(self, limits: Any) -> None:
        """Give the controller its own client: a token bucket of ``limits.kube_api_qps`` and
        ``limits.kube_api_burst`` (a settings.ControllerManager; qps 0: no limit)."""
        self.client = ratelimit.TokenBucket(self.clock, limits.kube_api_qps, limits.kube_api_burst)

    def write(self, resource: str, name: str, namespace: str | None, fn: Callable[[dict[str, Any]], None], *,
              read_first: bool = False) -> dict[str, Any] | None:
        """``store.mutate`` as the controller's client sends it: a GET first where upstream reads
        the object from the API rather than its informer (``read_first``), then the update only
        where ``fn`` changes the object, each after the client's bucket lets it go. None where
        nothing changed."""
        if read_first:
            self.request()
        probe = self.store.get(resource, name, namespace)
        before = copy.deepcopy(probe)
        fn(probe)
        if probe == before:
            return None
        self.request()
        result: dict[str, Any] = self.store.mutate(resource, name, namespace, fn)
        return result

    def requeue_failed(self, key: Hashable) -> None:
        """A failed sync: ``queue.AddRateLimited(key)`` (upstream's controllers, on any error:
        409, 429, 500, a webhook's or a quota's refusal)."""
        self.queue.add_after(key, self.retries.when(key))

    def _in_backoff(self, key: Hashable) -> bool:
        return self.retries.num_requeues(key) > 0

    # notifications (called in the writer's thread: must be fast)
    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == self.primary:
            self.queue.add(key_of(obj))

    def resync(self) -> None:
        """A safety net (upstream's informers resync every 12 to 24 hours): a key waiting out
        its failure back-off is left to it."""
        for obj in self.informer.list(self.primary) if self.primary else []:
            key = key_of(obj)
            if not self._in_backoff(key):
                self.queue.add(key)

    def sync(self, key: Any) -> None:
        raise NotImplementedError

    def start(self) -> None:
        for i in range(self.workers):
            self._spawn(self._work, f"{self.name}-{i}")
        self._spawn(self._resync_loop, f"{self.name}-resync")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"sim-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()

    def join(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _resync_loop(self) -> None:
        self.resync()
        # Measured again each time: the clock's scale may change while the cluster runs.
        while not self._stop.wait(max(self.clock.real(self.resync_seconds), MIN_RESYNC_REAL_SECONDS)):
            try:
                self.resync()
            except Exception:
                self.log.exception("resync failed")

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self.sync(key)
                self.retries.forget(key)
            except (errors.Conflict, errors.NotFound, errors.AlreadyExists) as exc:
                self.log.debug("retrying", extra={"key": str(key), "error": str(exc)})
                self.requeue_failed(key)
            except errors.StatusError as exc:
                if not self.stopped:
                    self.log.warning("sync failed", extra={"key": str(key), "error": str(exc)})
                self.requeue_failed(key)
            except ratelimit.Stopped:
                pass
            except Exception:
                if not self.stopped:
                    self.log.exception("sync failed", extra={"key": str(key)})
                self.requeue_failed(key)
            finally:
                self.queue.done(key)
