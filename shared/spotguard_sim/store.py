"""The simulated cluster's object store: thread-safe, in memory, with watches.

Objects are plain JSON dicts exactly as the API returns them. Each committed
object is serialised once (``Entry.raw``) so reads hand out fresh copies with
``json.loads`` and the HTTP layer can send lists without re-encoding.
"""

from __future__ import annotations

import bisect
import builtins
import collections
import contextlib
import gc
import itertools
import json
import logging
import queue
import random
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import orjson

from spotguard_sim import clock as clock_mod
from spotguard_sim import errors, limitranges, patching, patchmeta, quota, rbacpolicy, resources, selectors, strategies

log = logging.getLogger("spotguard.sim.store")

Obj = dict[str, Any]
Callback = Callable[[str, str, Obj], None]
ObjList = list[Obj]
EntryList = list["Entry"]
Pending = list[tuple[str, str, "Entry"]]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

HISTORY = 100_000  # watch events kept for resuming watches
# kube-apiserver --etcd-compaction-interval (storagebackend.DefaultCompactInterval, 5 minutes):
# every interval the compactor compacts etcd to the revision it saw one interval before
# (staging/src/k8s.io/apiserver/pkg/storage/etcd3/compact.go)
COMPACTION_INTERVAL = 300.0
_GEN_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# validation.RegexError's texts for them (apimachinery pkg/util/validation/validation.go)
DNS1123_LABEL_RULE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# resources whose spec changes bump metadata.generation
_GENERATION = frozenset(
    {"deployments", "replicasets", "statefulsets", "daemonsets", "poddisruptionbudgets",
     "horizontalpodautoscalers", "pods", "replicationcontrollers", "jobs", "cronjobs"}
)


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError as exc:
        raise errors.BadRequest(f"the object cannot be encoded as JSON: {exc}") from exc


_gc_lock = threading.Lock()
_gc_paused = [0]


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while copying many objects (5x faster lists)."""
    with _gc_lock:
        _gc_paused[0] += 1
        gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_paused[0] -= 1
            if _gc_paused[0] == 0:
                gc.enable()


_MAX_NAME = "\U0010ffff"  # sorts after every object name


def _key(entry: Entry) -> Key:
    meta = entry.obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


class Page(NamedTuple):
    """One page of a list: the entries, the store's resourceVersion, and what is left."""

    entries: EntryList
    resource_version: int
    more: bool  # a continue token is due
    remaining: int | None  # remainingItemCount (None with selectors, as upstream)


class Entry:
    """One stored object: the dict (never handed out) and its JSON bytes."""

    __slots__ = ("obj", "raw", "rv")

    def __init__(self, obj: Obj, rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self.raw = _dumps(obj)

    def copy(self) -> Obj:
        result: Obj = orjson.loads(self.raw)
        return result


class Event:
    __slots__ = ("entry", "namespace", "old", "resource", "rv", "type")

    def __init__(
        self, type_: str, resource: str, namespace: str, entry: Entry, old: Entry | None
    ) -> None:
        self.type = type_
        self.resource = resource
        self.namespace = namespace
        self.entry = entry
        self.old = old
        self.rv = entry.rv


class Watcher:
    """An iterator of ``{"type", "object"}`` events; ``close()`` ends it."""

    _CLOSED = object()

    def __init__(
        self,
        store: Store,
        resource: str,
        namespace: str | None,
        predicate: Callable[[Mapping[str, Any]], bool] | None,
    ) -> None:
        self._store = store
        self.resource = resource
        self.namespace = namespace
        self.predicate = predicate
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False

    # delivery (called under the store lock)
    def _offer(self, event: Event) -> None:
        if self.closed or event.resource != self.resource:
            return
        if self.namespace and event.namespace != self.namespace:
            return
        item = self._translate(event)
        if item is not None:
            self._queue.put(item)

    def _translate(self, event: Event) -> tuple[str, Entry] | None:
        if self.predicate is None:
            return (event.type, event.entry)
        now = self.predicate(event.entry.obj)
        if event.type == "ADDED":
            return ("ADDED", event.entry) if now else None
        if event.type == "DELETED":
            return ("DELETED", event.entry) if now else None
        before = event.old is not None and self.predicate(event.old.obj)
        if now and before:
            return ("MODIFIED", event.entry)
        if now:
            return ("ADDED", event.entry)
        if before:
            return ("DELETED", event.entry)
        return None

    def next_raw(self, timeout: float | None = None) -> tuple[str, Entry] | None:
        """The next (type, entry), or None on timeout / close."""
        if self.closed:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is self._CLOSED:
            self.closed = True
            return None
        result: tuple[str, Entry] = item
        return result

    def get(self, timeout: float | None = None) -> dict[str, Any] | None:
        item = self.next_raw(timeout)
        if item is None:
            return None
        return {"type": item[0], "object": item[1].copy()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        if not self.closed:
            self._store._unwatch(self)
            self._queue.put(self._CLOSED)

    @classmethod
    def failed(cls, store: Store, resource: str, status: dict[str, Any]) -> Watcher:
        """A watch that sends one ERROR event carrying ``status`` and ends."""
        watcher = cls(store, resource, None, None)
        watcher._queue.put(("ERROR", Entry(status, 0)))
        watcher._queue.put(cls._CLOSED)
        return watcher


class Admission(Protocol):
    """The admission chain a write passes through (the webhooks: ``spotguard_sim.admission``,
    which the API server, ``cluster``, hands the store). The storage sits below admission:
    it calls the chain it is given and never imports it; a store given none runs no
    webhooks (as one with no webhook configurations)."""

    def admit_create(
        self, store: Store, resource: str, obj: Obj, *, namespace: str, user: Mapping[str, Any] | None, dry_run: bool
    ) -> Obj: ...

    def wants(self, store: Store, resource: str, operation: str, subresource: str | None = None) -> bool: ...

    def admit(self, store: Store, resource: str, obj: Obj | None, *, namespace: str,
              user: Mapping[str, Any] | None, dry_run: bool, operation: str = "CREATE",
              old: Obj | None = None, subresource: str | None = None, kind: str = "mutatingwebhookconfigurations",
              name: str = "") -> Obj: ...

    def validate_eviction(self, store: Store, namespace: str, name: str, eviction: Obj, *,
                          user: Mapping[str, Any] | None, dry_run: bool) -> None: ...


class Store:
    """Thread-safe in-memory store of Kubernetes objects (see SIM_STORE.md)."""

    def __init__(
        self, clock: clock_mod.Clock | None = None, *, history: int = HISTORY, admission: Admission | None = None
    ) -> None:
        self.clock = clock or clock_mod.Clock()
        self.lock = threading.RLock()
        self._rv = 1
        # resource -> namespace ("" for cluster scope) -> name -> entry
        self._data: dict[str, dict[str, dict[str, Entry]]] = {
            t.plural: {} for t in resources.TYPES
        }
        # resource -> every (namespace, name) in order: lists and list pages walk it
        # instead of sorting the collection on each request
        self._keys: dict[str, list[Key]] = {t.plural: [] for t in resources.TYPES}
        self._pods_by_node: dict[str, dict[tuple[str, str], Entry]] = {}
        self._dependents: dict[str, set[tuple[str, str, str]]] = {}
        # owners deleted in the foreground, waiting for their dependents: uid -> key
        self._foreground: dict[str, tuple[str, str, str]] = {}
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        # time-based compaction (simulated seconds; 0 turns it off): resourceVersions
        # below ``_compacted`` are gone, as etcd's after a compaction
        self.compaction_interval = COMPACTION_INTERVAL
        self._compacted = 0
        self._compact_seen: int | None = None  # the revision seen at the last tick
        self._next_compaction = self.clock.now() + COMPACTION_INTERVAL
        self._watchers: list[Watcher] = []
        self._subscribers: list[tuple[Callback, frozenset[str] | None]] = []  # callback, its resources
        self._local = threading.local()
        self.admission_enabled = True
        self.admission = admission
        for name in SYSTEM_NAMESPACES:
            self.create("namespaces", {"metadata": {"name": name}})
        for plural, obj in (*strategies.bootstrap_objects(), *rbacpolicy.bootstrap_objects()):
            self.create(plural, obj)

    # ---- compaction ---------------------------------------------------------

    def set_compaction_interval(self, seconds: float) -> None:
        """kube-apiserver's ``--etcd-compaction-interval`` in simulated seconds (0: never)."""
        with self.lock:
            self.compaction_interval = float(seconds)
            self._compact_seen = None
            self._next_compaction = self.clock.now() + self.compaction_interval

    def compact(self) -> int:
        """Compact to the current revision now (``etcdctl compact $REV``); returns it."""
        with self.lock:
            self._compacted = max(self._compacted, self._rv)
            return self._compacted

    def compacted_revision(self) -> int:
        """The oldest resourceVersion still readable: older ones answer 410 Gone."""
        with self.lock:
            self._compact_due()
            return self._compacted

    def _compact_due(self) -> None:
        """Run the compactor's ticks that are due (lock held). Every commit and every
        read of old revisions calls this, so the revision seen at a tick is the store's
        revision then; each tick compacts to the revision seen at the tick before."""
        interval = self.compaction_interval
        if interval <= 0:
            return
        now = self.clock.now()
        if now < self._next_compaction:
            return
        if now >= self._next_compaction + 2 * interval:  # idle for several ticks
            self._compacted = max(self._compacted, self._rv)
            self._compact_seen = self._rv
            self._next_compaction = now + interval
            return
        while now >= self._next_compaction:
            if self._compact_seen is not None:
                self._compacted = max(self._compacted, self._compact_seen)
            self._compact_seen = self._rv
            self._next_compaction += interval

    def check_not_compacted(self, rv: int, message: str) -> None:
        """410 Gone (reason Expired) when revision ``rv`` has been compacted."""
        with self.lock:
            self._compact_due()
            if rv < self._compacted:
                raise errors.Gone(message)

    # ---- reads -------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def _bucket(self, resource: str) -> dict[str, dict[str, Entry]]:
        try:
            return self._data[resource]
        except KeyError:
            raise errors.NotFound(
                f"the server could not find the requested resource ({resource})"
            ) from None

    def _ns(self, resource: str, namespace: str | None) -> str:
        rtype = resources.get(resource)
        if not rtype.namespaced:
            return ""
        return namespace or "default"

    def _entry(self, resource: str, name: str, namespace: str | None) -> Entry:
        ns = self._ns(resource, namespace)
        entry = self._bucket(resource).get(ns, {}).get(name)
        if entry is None:
            rtype = resources.get(resource)
            raise errors.not_found(resource, name, rtype.group)
        return entry

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        with self.lock:
            return self._entry(resource, name, namespace).copy()

    def get_raw(self, resource: str, name: str, namespace: str | None = None) -> bytes:
        with self.lock:
            return self._entry(resource, name, namespace).raw

    def _select(
        self,
        resource: str,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
    ) -> EntryList:
        bucket = self._bucket(resource)
        predicate = selectors.object_filter(label_selector, field_selector, resource)
        fields = selectors.parse_fields(field_selector, resource)
        candidates: Iterator[Entry] | EntryList
        node = fields.equals("spec.nodeName") if resource == "pods" else None
        name = fields.equals("metadata.name")
        ns_field = fields.equals("metadata.namespace")
        if ns_field is not None:
            if namespace and namespace != ns_field:
                return []
            namespace = ns_field
        if node:
            candidates = [
                e for (ns, _), e in self._pods_by_node.get(node, {}).items()
                if not namespace or ns == namespace
            ]
            candidates.sort(key=lambda e: (e.obj["metadata"].get("namespace", ""),
                                           e.obj["metadata"]["name"]))
        elif namespace and resources.get(resource).namespaced:
            names = bucket.get(namespace, {})
            if name is not None:
                candidates = [names[name]] if name in names else []
            else:
                candidates = [names[n] for n in sorted(names)]
        else:
            candidates = [bucket[ns][n] for ns, n in self._keys[resource]]
        if predicate is None:
            return list(candidates)
        return [e for e in candidates if predicate(e.obj)]

    def list_page(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        after: Key | None = None,
        limit: int = 0,
    ) -> Page:
        """One page of a list, in (namespace, name) order, for ``limit``/``continue``.

        The entries after the key ``after`` (the last key of the previous page), at most
        ``limit`` of them (all when ``limit`` <= 0). A page costs O(log n + its size) on
        the sorted key index, so paging through a collection costs about one full list,
        as with kube-apiserver over etcd (not a re-filtered, re-sorted copy per page).
        Like the continue pages of the rest of the sim (and unlike etcd), a later page
        shows the store as it is now, not as it was at the first page's resourceVersion.
        """
        with self.lock:
            rv = self._rv
            bucket = self._bucket(resource)
            fields = selectors.parse_fields(field_selector, resource)
            selected = bool(label_selector or field_selector)
            node = fields.equals("spec.nodeName") if resource == "pods" else None
            if node or fields.equals("metadata.name") is not None:
                # small candidate sets: select them, then skip to the continue key
                found = self._select(resource, namespace, label_selector, field_selector)
                if after is not None:
                    found = [e for e in found if _key(e) > after]
                more = 0 < limit < len(found)
                return Page(found[:limit] if more else found, rv, more, None)
            predicate = selectors.object_filter(label_selector, field_selector, resource)
            ns_field = fields.equals("metadata.namespace")
            if ns_field is not None:
                if namespace and namespace != ns_field:
                    return Page([], rv, False, None)
                namespace = ns_field
            keys = self._keys[resource]
            lo, hi = 0, len(keys)
            if namespace and resources.get(resource).namespaced:
                lo = bisect.bisect_left(keys, (namespace,))
                hi = bisect.bisect_left(keys, (namespace, _MAX_NAME), lo)
            if after is not None:
                lo = max(lo, bisect.bisect_right(keys, after))
            want = limit + 1 if limit > 0 else hi - lo
            page: EntryList = []
            i = lo
            while i < hi and len(page) < want:
                ns, name = keys[i]
                entry = bucket[ns][name]
                if predicate is None or predicate(entry.obj):
                    page.append(entry)
                i += 1
            more = 0 < limit < len(page)
            if not more:
                return Page(page, rv, False, None)
            # i is one past the extra entry; upstream counts the rest only when unfiltered
            return Page(page[:limit], rv, True, None if selected else hi - i + 1)

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[ObjList, str]:
        """Copies of the matching objects and the list's resourceVersion."""
        with self.lock:
            entries = self._select(resource, namespace, label_selector, field_selector)
            rv = str(self._rv)
        with no_gc():
            return [e.copy() for e in entries], rv

    def list_entries(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[EntryList, int]:
        """The matching entries (read-only, for the HTTP layer) and the resourceVersion."""
        with self.lock:
            return self._select(resource, namespace, label_selector, field_selector), self._rv

    def count(self, resource: str) -> int:
        """How many ``resource`` objects there are. Read without the store lock (each call
        below is atomic under the GIL), as admission asks it on every write (is there any
        webhook configuration?): a count a write is changing at that moment is that of
        just before or after it."""
        return sum(map(len, list(self._bucket(resource).values())))

    def count_in(self, resource: str, namespace: str) -> int:
        """How many ``resource`` objects ``namespace`` holds (without the lock, as ``count``;
        the quota controller asks it on every notification)."""
        return len(self._bucket(resource).get(namespace, {}))

    # ---- watches and subscribers -----------------------------------------

    def watch(
        self,
        resource: str,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        initial_events_end: bool = False,
    ) -> Watcher:
        """Events after ``resource_version``; with none (or "0"), ADDED for every object first.

        ``initial_events_end`` (a watch with ``sendInitialEvents=true``) follows the
        initial ADDED events with a BOOKMARK annotated ``k8s.io/initial-events-end``.
        """
        predicate = selectors.object_filter(label_selector, field_selector, resource)
        rtype = resources.get(resource)
        watcher = Watcher(self, resource, namespace or None, predicate)
        with self.lock:
            if resource_version in (None, "", "0"):
                for entry in self._select(resource, namespace, label_selector, field_selector):
                    watcher._queue.put(("ADDED", entry))
                if initial_events_end:
                    mark = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": {
                        "resourceVersion": str(self._rv),
                        "annotations": {"k8s.io/initial-events-end": "true"}}}
                    watcher._queue.put(("BOOKMARK", Entry(mark, self._rv)))
            else:
                try:
                    since = int(str(resource_version))
                except ValueError:
                    raise errors.BadRequest(
                        f"invalid resource version {resource_version!r}"
                    ) from None
                oldest = self._history[0].rv if self._history else self._rv + 1
                if since < oldest - 1 and since < self._rv:
                    raise errors.Gone(
                        f"too old resource version: {since} ({oldest - 1})"
                    )
                self._compact_due()
                if since + 1 < self._compacted:  # etcd: the watch's start revision is compacted
                    raise errors.Gone(
                        f"too old resource version: {since} ({self._compacted - 1})"
                    )
                for event in self._history:
                    if event.rv > since:
                        watcher._offer(event)
            self._watchers.append(watcher)
        return watcher

    def _unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def subscribe(self, callback: Callback, resources: Collection[str] | None = None) -> None:
        """``callback(event_type, resource, obj)`` after each committed change; with
        ``resources``, of those only (each call hands over a copy of the object, which the
        other writes then do not cost)."""
        with self.lock:
            self._subscribers.append((callback, None if resources is None else frozenset(resources)))

    def unsubscribe(self, callback: Callback) -> None:
        with self.lock:
            for i, (subscribed, _) in enumerate(self._subscribers):
                if subscribed == callback:
                    del self._subscribers[i]
                    break

    def close(self) -> None:
        with self.lock:
            watchers = list(self._watchers)
            self._subscribers.clear()
        for w in watchers:
            w.close()

    # ---- commit machinery -------------------------------------------------

    def _pending(self) -> Pending:
        pending: Pending | None = getattr(self._local, "pending", None)
        if pending is None:
            pending = []
            self._local.pending = pending
        return pending

    def _flush(self) -> None:
        """Run subscriber callbacks for this thread's commits, outside the lock."""
        pending = getattr(self._local, "pending", None)
        if not pending or getattr(self._local, "flushing", False):
            return
        self._local.flushing = True
        try:
            while pending:
                type_, resource, entry = pending.pop(0)
                for callback, wanted in list(self._subscribers):
                    if wanted is not None and resource not in wanted:
                        continue
                    try:
                        callback(type_, resource, entry.copy())
                    except Exception:
                        log.exception("store subscriber failed", extra={"resource": resource})
        finally:
            self._local.flushing = False

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _commit(
        self, type_: str, resource: str, ns: str, obj: Obj, old: Entry | None
    ) -> Entry:
        """Store (or for DELETED, drop) ``obj`` with a new resourceVersion. Lock held."""
        self._compact_due()
        rv = self._next_rv()
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        entry = Entry(obj, rv)
        name = obj["metadata"]["name"]
        bucket = self._data[resource]
        keys = self._keys[resource]
        if type_ == "DELETED":
            names = bucket.get(ns)
            if names is not None:
                if names.pop(name, None) is not None:
                    at = bisect.bisect_left(keys, (ns, name))
                    if at < len(keys) and keys[at] == (ns, name):
                        del keys[at]
                if not names:
                    bucket.pop(ns, None)
        else:
            names = bucket.setdefault(ns, {})
            if name not in names:
                bisect.insort(keys, (ns, name))
            names[name] = entry
        self._index(resource, ns, name, old, None if type_ == "DELETED" else entry)
        event = Event(type_, resource, ns, entry, old)
        self._history.append(event)
        for w in self._watchers:
            w._offer(event)
        if self._subscribers:
            self._pending().append((type_, resource, entry))
        return entry

    def _index(
        self, resource: str, ns: str, name: str, old: Entry | None, new: Entry | None
    ) -> None:
        key = (ns, name)
        if resource == "pods":
            old_node = (old.obj.get("spec") or {}).get("nodeName") if old else None
            new_node = (new.obj.get("spec") or {}).get("nodeName") if new else None
            if old_node and old_node != new_node:
                on_node = self._pods_by_node.get(old_node)
                if on_node is not None:
                    on_node.pop(key, None)
                    if not on_node:
                        del self._pods_by_node[old_node]
            if new_node and new is not None:
                self._pods_by_node.setdefault(new_node, {})[key] = new
        old_owners = {o.get("uid") for o in (old.obj["metadata"].get("ownerReferences") or [])} if old else set()
        new_owners = {o.get("uid") for o in (new.obj["metadata"].get("ownerReferences") or [])} if new else set()
        ref = (resource, ns, name)
        for uid in old_owners - new_owners:
            deps = self._dependents.get(str(uid))
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self._dependents[str(uid)]
        for uid in new_owners:
            if uid:
                self._dependents.setdefault(str(uid), set()).add(ref)

    # ---- writes -------------------------------------------------------------

    def create(
        self,
        resource: str,
        obj: Obj,
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        user: Mapping[str, Any] | None = None,
    ) -> Obj:
        rtype = resources.get(resource)
        if not isinstance(obj, dict):
            raise errors.BadRequest("the object must be a JSON object")
        obj = orjson.loads(_dumps(obj))
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise errors.BadRequest("metadata must be an object")
        self._check_kind(rtype, obj)
        if rtype.namespaced:
            ns_in_obj = meta.get("namespace")
            if namespace and ns_in_obj and ns_in_obj != namespace:
                raise errors.BadRequest(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            ns = namespace or ns_in_obj or "default"
            meta["namespace"] = ns
        else:
            ns = ""
            meta.pop("namespace", None)
        if not meta.get("name") and not meta.get("generateName"):
            raise errors.invalid(
                rtype.kind, "", [{"field": "metadata.name", "message":
                                  "Required value: name or generateName is required"}],
                rtype.group,
            )
        for key in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "selfLink"):
            meta.pop(key, None)
        _default(resource, obj)
        if rtype.namespaced:
            with self.lock:
                ns_entry = self._data["namespaces"].get("", {}).get(ns)
            if ns_entry is None:
                raise errors.not_found("namespaces", ns)
            if ns_entry.obj["metadata"].get("deletionTimestamp"):
                # NamespaceLifecycle: admission.NewForbidden names the object (its
                # generateName before a name is generated)
                raise errors.forbidden(
                    resource, str(meta.get("name") or meta.get("generateName") or "Unknown"),
                    f"unable to create new content in namespace {ns} because it is being terminated",
                    rtype.group)
        strategies.admit(self, resource, obj)
        ranges = self._limit_ranges(ns) if resource == "pods" else []
        if ranges and limitranges.mutate_pod(obj, ranges):  # LimitRanger, before the webhooks
            obj["status"]["qosClass"] = _qos(obj.get("spec") or {})
        if self.admission_enabled and self.admission is not None and resource not in (
            "mutatingwebhookconfigurations", "validatingwebhookconfigurations"
        ):
            obj = self.admission.admit_create(
                self, resource, obj, namespace=ns, user=user, dry_run=dry_run
            )
            meta = obj.setdefault("metadata", {})
            if rtype.namespaced:
                meta["namespace"] = ns
        if ranges:
            limitranges.validate_pod(obj, ranges)
        generated = not meta.get("name")
        if generated:
            meta["name"] = _generate(str(meta["generateName"]))
        self._validate(rtype, obj)
        meta["uid"] = str(uuid.uuid4())
        created = self.clock.iso()
        strategies.prepare_create(rtype, obj, created)
        meta["creationTimestamp"] = created
        if resource in _GENERATION:
            meta["generation"] = 1
        if rtype.has_status and resource not in ("pods", "nodes", "namespaces"):
            obj.setdefault("status", {})
        try:
            with self.lock:
                if rtype.namespaced and self._data["resourcequotas"].get(ns):
                    # ResourceQuota admission, last, with the namespace's usage as it is now
                    quota.admit(rtype, obj, [e.obj for e in self._data["resourcequotas"][ns].values()],
                                lambda plural: [e.obj for e in self._data[plural].get(ns, {}).values()],
                                self.clock.now())
                names = self._data[resource].get(ns, {})
                # A generated name already taken is drawn again, up to 7 more times
                # (RetryGenerateName, on by default since Kubernetes 1.31, KEP-4420); a
                # client-chosen one is a 409.
                for _ in range(7 if generated else 0):
                    if meta["name"] not in names:
                        break
                    meta["name"] = _generate(str(meta["generateName"]))
                if meta["name"] in names:
                    raise errors.already_exists(resource, meta["name"], rtype.group)
                if dry_run:
                    result: Obj = orjson.loads(_dumps(obj))
                    return result
                entry = self._commit("ADDED", resource, ns, obj, None)
                return entry.copy()
        finally:
            self._flush()

    def _check_kind(self, rtype: resources.ResourceType, obj: Obj) -> None:
        kind = obj.get("kind")
        api_version = obj.get("apiVersion")
        if kind and kind != rtype.kind:
            raise errors.BadRequest(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rtype.api_version})" if api_version != rtype.api_version else
                f"kind {kind} does not match the resource {rtype.plural}"
            )
        if api_version and api_version != rtype.api_version:
            raise errors.BadRequest(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rtype.api_version})"
            )
        obj["kind"] = rtype.kind
        obj["apiVersion"] = rtype.api_version

    def _limit_ranges(self, namespace: str) -> builtins.list[Obj]:
        """The namespace's LimitRanges, as the LimitRanger's informer holds them."""
        with self.lock:
            return [e.obj for e in self._data["limitranges"].get(namespace, {}).values()]

    def _validate(self, rtype: resources.ResourceType, obj: Obj) -> None:
        name = str(obj["metadata"].get("name", ""))
        pattern, limit = (_LABEL, 63) if rtype.plural == "namespaces" else (_SUBDOMAIN, 253)
        causes: list[dict[str, str]] = []
        if rtype.group == resources.RBAC or rtype.plural == "apiservices":
            # ValidateRBACName, and an APIService's IsPathSegmentName (its name must also be
            # version.group: strategies): any path segment name
            if name in (".", "..") or "/" in name or "%" in name:
                causes.append({"field": "metadata.name",
                               "message": f'Invalid value: "{name}": may not contain \'/\' or \'%\''})
        else:
            # apimachinery pkg/util/validation/validation.go IsDNS1123Label / IsDNS1123Subdomain:
            # one cause per message, the length first
            quoted = json.dumps(name)
            if len(name) > limit:
                causes.append({"field": "metadata.name",
                               "message": f"Invalid value: {quoted}: must be no more than {limit} characters"})
            if not pattern.match(name):
                if rtype.plural == "namespaces" and _SUBDOMAIN.match(name):
                    rule = "must not contain dots"
                elif rtype.plural == "namespaces":
                    rule = DNS1123_LABEL_RULE
                else:
                    rule = DNS1123_SUBDOMAIN_RULE
                causes.append({"field": "metadata.name", "message": f"Invalid value: {quoted}: {rule}"})
        labels = obj["metadata"].get("labels")
        if labels is not None and not isinstance(labels, dict):
            causes.append({"field": "metadata.labels", "message": "Invalid value: must be a map"})
        elif labels:
            for key, value in labels.items():
                if not isinstance(value, str) or len(value) > 63 or (
                    value and not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", value)
                ):
                    causes.append({"field": f"metadata.labels: Invalid value: {value!r}",
                                   "message": "a valid label must be an empty string or consist "
                                   "of alphanumeric characters, '-', '_' or '.'"})
                if not selectors._KEY.match(str(key)):
                    causes.append({"field": f"metadata.labels: Invalid value: {key!r}",
                                   "message": "name part must consist of alphanumeric characters"})
        annotations = obj["metadata"].get("annotations")
        if annotations:
            for key, value in annotations.items():
                if not isinstance(value, str):
                    causes.append({"field": f"metadata.annotations.{key}",
                                   "message": "Invalid value: annotation values must be strings"})
        if rtype.plural == "pods":
            containers = (obj.get("spec") or {}).get("containers")
            if not containers:
                causes.append({"field": "spec.containers", "message": "Required value"})
        if rtype.plural == "limitranges":
            causes.extend(limitranges.validate_limit_range(obj))
        if rtype.plural in ("deployments", "replicasets", "statefulsets"):
            replicas = (obj.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                causes.append({"field": "spec.replicas",
                               "message": f"Invalid value: {replicas!r}: must be greater than "
                               "or equal to 0"})
        if causes:
            raise errors.invalid(rtype.kind, name, causes, rtype.group)

    def update(
        self,
        resource: str,
        obj: Obj,
        *,
        dry_run: bool = False,
        subresource: str | None = None,
        namespace: str | None = None,
        user: Mapping[str, Any] | None = None,
    ) -> Obj:
        """Replace an object (409 on a stale resourceVersion)."""
        rtype = resources.get(resource)
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise errors.BadRequest("the object must be a JSON object with metadata")
        obj = orjson.loads(_dumps(obj))
        self._check_kind(rtype, obj)
        name = obj["metadata"].get("name")
        if not name:
            raise errors.BadRequest("name is required for update")
        ns = self._ns(resource, namespace or obj["metadata"].get("namespace"))
        if namespace and obj["metadata"].get("namespace") not in (None, namespace):
            raise errors.BadRequest(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if self._reviews(resource, "UPDATE", subresource):
            def replacement(current: Obj, rv: int) -> tuple[Obj, bool]:
                return orjson.loads(_dumps(obj)), obj["metadata"].get("resourceVersion") not in (None, "")

            return self._admitted(rtype, ns, name, replacement, dry_run=dry_run,
                                  subresource=subresource, user=user)
        try:
            with self.lock:
                return self._replace(
                    rtype=rtype, ns=ns, name=name, obj=obj, dry_run=dry_run,
                    subresource=subresource,
                )
        finally:
            self._flush()

    def _reviews(self, resource: str, operation: str, subresource: str | None = None) -> bool:
        """Whether a mutating webhook wants to see this request (UPDATE, DELETE)."""
        if not self.admission_enabled or self.admission is None or resource == "mutatingwebhookconfigurations":
            return False
        if subresource == "scale":
            return False  # the route reviews the Scale object itself
        return self.admission.wants(self, resource, operation, subresource)

    def _admitted(
        self,
        rtype: resources.ResourceType,
        ns: str,
        name: str,
        build: Callable[[Obj, int], tuple[Obj, bool]],
        *,
        dry_run: bool,
        subresource: str | None,
        user: Mapping[str, Any] | None,
    ) -> Obj:
        """An update or patch that webhooks review: ``build`` makes the new object from a
        snapshot (and says whether the client pinned a resourceVersion); the webhooks see it
        outside the lock; it is written if the object did not change meanwhile, else built
        again, as kube-apiserver's guaranteed updates retry."""
        admission = self.admission
        assert admission is not None  # _reviews said so
        for _ in range(8):
            with self.lock:
                entry = self._entry(rtype.plural, name, ns)
                current, rv = entry.copy(), entry.rv
            new, pinned = build(current, rv)
            if not pinned:
                new.setdefault("metadata", {})["resourceVersion"] = str(rv)
            new = admission.admit(self, rtype.plural, new, namespace=ns, user=user, dry_run=dry_run,
                                  operation="UPDATE", old=current, subresource=subresource)
            try:
                with self.lock:
                    if not pinned and self._entry(rtype.plural, name, ns).rv != rv:
                        continue
                    return self._replace(rtype=rtype, ns=ns, name=name, obj=new, dry_run=dry_run,
                                         subresource=subresource)
            finally:
                self._flush()
        raise errors.conflict(rtype.plural, name, rtype.group)

    def _replace(
        self,
        *,
        rtype: resources.ResourceType,
        ns: str,
        name: str,
        obj: Obj,
        dry_run: bool,
        subresource: str | None,
    ) -> Obj:
        resource = rtype.plural
        old = self._entry(resource, name, ns)
        rv = obj["metadata"].get("resourceVersion")
        if rv not in (None, "") and str(rv) != str(old.rv):
            raise errors.conflict(resource, name, rtype.group)
        current = old.copy()
        if subresource == "status":
            new = old.copy()  # not ``current``: comparing a thing with itself stored nothing
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            strategies.validate_status_update(rtype, new)
        else:
            new = obj
            new_meta = new["metadata"]
            old_meta = current["metadata"]
            for key in ("uid", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation"):
                if key in old_meta:
                    new_meta[key] = old_meta[key]
                else:
                    new_meta.pop(key, None)
            new_meta["name"] = name
            if rtype.namespaced:
                new_meta["namespace"] = ns
            else:
                new_meta.pop("namespace", None)
            if rtype.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            _default(resource, new)
            self._validate(rtype, new)
            strategies.validate_update(rtype, current, new)
            if resource == "pods":
                _check_pod_update(current, new)
        if resource in _GENERATION and new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if dry_run:
            new["metadata"]["resourceVersion"] = str(old.rv)
            return new
        if new == current:
            return current  # a no-op write does not bump the resourceVersion
        entry = self._commit("MODIFIED", resource, ns, new, old)
        self._finish_if_released(rtype, ns, name, entry)
        return entry.copy()

    def _finish_if_released(
        self, rtype: resources.ResourceType, ns: str, name: str, entry: Entry
    ) -> None:
        """An object marked for deletion whose finalizers are gone is removed."""
        meta = entry.obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return
        if rtype.plural == "pods" and (entry.obj.get("spec") or {}).get("nodeName"):
            return  # the kubelet removes it
        self._remove_locked(rtype.plural, ns, name)

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        patch_type: str,
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        subresource: str | None = None,
        user: Mapping[str, Any] | None = None,
    ) -> Obj:
        """Apply a json / merge / strategic patch (atomically, under the lock)."""
        rtype = resources.get(resource)
        ns = self._ns(resource, namespace)
        if self._reviews(resource, "UPDATE", subresource):
            def patched_copy(current: Obj, rv: int) -> tuple[Obj, bool]:
                patched = patching.apply(current, patch, patch_type, patchmeta.root(rtype))
                meta = patched.get("metadata")
                if not isinstance(meta, dict) or meta.get("name", name) != name:
                    raise errors.BadRequest("the patch removed metadata or changed the name")
                pinned = meta.get("resourceVersion") not in (None, "", str(rv))
                self._check_kind(rtype, patched)
                return patched, pinned

            return self._admitted(rtype, ns, name, patched_copy, dry_run=dry_run,
                                  subresource=subresource, user=user)
        try:
            with self.lock:
                current = self._entry(resource, name, ns).copy()
                patched = patching.apply(current, patch, patch_type, patchmeta.root(rtype))
                meta = patched.get("metadata")
                if not isinstance(meta, dict):
                    raise errors.BadRequest("the patch removed metadata")
                if meta.get("name", name) != name:
                    raise errors.BadRequest("the name of the object cannot be changed by a patch")
                if rtype.namespaced and meta.get("namespace", ns) != ns:
                    raise errors.BadRequest("the namespace of the object cannot be changed")
                if meta.get("uid", current["metadata"]["uid"]) != current["metadata"]["uid"]:
                    raise errors.conflict(resource, name, rtype.group)
                if "resourceVersion" not in meta:
                    meta["resourceVersion"] = ""
                self._check_kind(rtype, patched)
                return self._replace(
                    rtype=rtype, ns=ns, name=name, obj=patched, dry_run=dry_run,
                    subresource=subresource,
                )
        finally:
            self._flush()

    def mutate(
        self, resource: str, name: str, namespace: str | None, fn: Callable[[Obj], None]
    ) -> Obj:
        """Read-modify-write under the lock: ``fn`` edits a copy in place. For controllers."""
        rtype = resources.get(resource)
        ns = self._ns(resource, namespace)
        try:
            with self.lock:
                old = self._entry(resource, name, ns)
                current = old.copy()
                fn(current)
                meta = current.setdefault("metadata", {})
                meta["name"] = name
                meta["uid"] = old.obj["metadata"]["uid"]
                if rtype.namespaced:
                    meta["namespace"] = ns
                if resource in _GENERATION and current.get("spec") != old.obj.get("spec"):
                    meta["generation"] = int(old.obj["metadata"].get("generation", 1)) + 1
                meta["resourceVersion"] = str(old.rv)
                if current == old.obj:
                    return current
                entry = self._commit("MODIFIED", resource, ns, current, old)
                self._finish_if_released(rtype, ns, name, entry)
                return entry.copy()
        finally:
            self._flush()

    def delete(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        grace_period_seconds: int | None = None,
        preconditions: Mapping[str, Any] | None = None,
        propagation_policy: str | None = None,
        user: Mapping[str, Any] | None = None,
    ) -> Obj:
        """Delete; scheduled pods with a grace period are marked and left for the kubelet."""
        ns = self._ns(resource, namespace)
        if self._reviews(resource, "DELETE"):
            assert self.admission is not None
            self.admission.admit(self, resource, None, namespace=ns, user=user, dry_run=dry_run,
                            operation="DELETE", old=self.get(resource, name, ns))
        if propagation_policy is None and resources.get(resource).orphan_by_default:
            propagation_policy = "Orphan"
        try:
            with self.lock:
                return self._delete_locked(
                    resource, name, ns, dry_run=dry_run,
                    grace_period_seconds=grace_period_seconds,
                    preconditions=preconditions, propagation_policy=propagation_policy,
                )
        finally:
            self._flush()

    def _delete_locked(
        self,
        resource: str,
        name: str,
        ns: str,
        *,
        dry_run: bool = False,
        grace_period_seconds: int | None = None,
        preconditions: Mapping[str, Any] | None = None,
        propagation_policy: str | None = None,
    ) -> Obj:
        entry = self._entry(resource, name, ns)
        obj = entry.copy()
        meta = obj["metadata"]
        if preconditions:
            uid = preconditions.get("uid")
            rv = preconditions.get("resourceVersion")
            if uid and uid != meta.get("uid"):
                # rest.BeforeDelete checks the preconditions first, naming the object by its kind
                raise errors.conflict(
                    resources.get(resource).kind, name, resources.get(resource).group,
                    err=f"the UID in the precondition ({uid}) does not match the UID in record "
                    f"({meta.get('uid')}). The object might have been deleted and then recreated",
                )
            if rv and str(rv) != meta.get("resourceVersion"):
                raise errors.conflict(
                    resources.get(resource).kind, name, resources.get(resource).group,
                    err=f"the ResourceVersion in the precondition ({rv}) does not match the "
                    f"ResourceVersion in record ({meta.get('resourceVersion')}). The object might "
                    "have been modified",
                )
        if dry_run:
            return obj
        if propagation_policy == "Foreground" and resource != "pods" and self._dependents.get(
                str(meta.get("uid", ""))):
            return self._delete_foreground(resource, ns, entry)
        graceful = bool(
            resource == "pods"
            and (obj.get("spec") or {}).get("nodeName")
            and grace_period_seconds != 0
            and (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
        if graceful or meta.get("finalizers"):
            grace = grace_period_seconds
            if grace is None:
                grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            if not graceful:
                grace = 0
            previous = meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionTimestamp") and previous is not None and grace >= previous:
                return obj
            meta["deletionTimestamp"] = self.clock.iso(self.clock.now() + grace)
            meta["deletionGracePeriodSeconds"] = grace
            new_entry = self._commit("MODIFIED", resource, ns, obj, entry)
            if propagation_policy == "Orphan":
                self._orphan(str(meta.get("uid", "")))
            else:
                self._cascade(str(meta.get("uid", "")))
            return new_entry.copy()
        return self._remove_locked(resource, ns, name, propagation_policy)

    def remove(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        """Remove at once (kubelet, node lifecycle); raises NotFound."""
        ns = self._ns(resource, namespace)
        try:
            with self.lock:
                return self._remove_locked(resource, ns, name)
        finally:
            self._flush()

    def _remove_locked(
        self, resource: str, ns: str, name: str, propagation_policy: str | None = None
    ) -> Obj:
        entry = self._entry(resource, name, ns)
        obj = entry.copy()
        uid = str(obj["metadata"].get("uid", ""))
        gone = self._commit("DELETED", resource, ns, obj, entry)
        for owner in obj["metadata"].get("ownerReferences") or []:
            self._release_foreground(str(owner.get("uid", "")))
        if resource == "namespaces":
            for plural, bucket in self._data.items():
                for item in list(bucket.get(name, {})):
                    if item in bucket.get(name, {}):
                        self._remove_locked(plural, name, item, "_namespace")
        if propagation_policy == "_namespace":
            self._dependents.pop(uid, None)  # the namespace's objects all go
        elif propagation_policy == "Orphan":
            self._orphan(uid)
        else:
            self._cascade(uid)
        return gone.copy()

    def _delete_foreground(self, resource: str, ns: str, entry: Entry) -> Obj:
        """Foreground cascading deletion: the owner is marked (deletionTimestamp, finalizer
        foregroundDeletion) and stays until its dependents, deleted in the foreground too,
        are gone (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion)."""
        obj = entry.copy()
        meta = obj["metadata"]
        uid = str(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        meta["finalizers"] = finalizers
        meta.setdefault("deletionTimestamp", self.clock.iso())
        meta.setdefault("deletionGracePeriodSeconds", 0)
        marked = self._commit("MODIFIED", resource, ns, obj, entry)
        self._foreground[uid] = (resource, ns, meta["name"])
        for dep_resource, dep_ns, dep_name in sorted(self._dependents.get(uid, set())):
            dep = self._data[dep_resource].get(dep_ns, {}).get(dep_name)
            if dep is None or dep.obj["metadata"].get("deletionTimestamp"):
                continue
            owners = dep.obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") != uid and self._owner_alive(str(o.get("uid"))) for o in owners):
                continue
            self._delete_locked(dep_resource, dep_name, dep_ns, propagation_policy="Foreground")
        self._release_foreground(uid)
        current = self._data[resource].get(ns, {}).get(meta["name"])
        return (current or marked).copy()

    def _release_foreground(self, uid: str) -> None:
        """An owner waiting in the foreground whose dependents are all gone is removed."""
        key = self._foreground.get(uid)
        if key is None or self._dependents.get(uid):
            return
        del self._foreground[uid]
        resource, ns, name = key
        entry = self._data[resource].get(ns, {}).get(name)
        if entry is None:
            return
        obj = entry.copy()
        obj["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or []
                                         if f != "foregroundDeletion"]
        if not obj["metadata"]["finalizers"]:
            del obj["metadata"]["finalizers"]
        released = self._commit("MODIFIED", resource, ns, obj, entry)
        self._finish_if_released(resources.get(resource), ns, name, released)

    def _cascade(self, uid: str) -> None:
        """Background garbage collection of the dependents of ``uid``."""
        for resource, ns, name in sorted(self._dependents.pop(uid, set())):
            entry = self._data[resource].get(ns, {}).get(name)
            if entry is None:
                continue
            owners = entry.obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") != uid and self._owner_alive(str(o.get("uid"))) for o in owners):
                continue
            self._delete_locked(resource, name, ns)

    def _owner_alive(self, uid: str) -> bool:
        for bucket in self._data.values():
            for names in bucket.values():
                for entry in names.values():
                    if entry.obj["metadata"].get("uid") == uid:
                        return True
        return False

    def _orphan(self, uid: str) -> None:
        for resource, ns, name in sorted(self._dependents.pop(uid, set())):
            old = self._data[resource].get(ns, {}).get(name)
            if old is None:
                continue
            obj = old.copy()
            refs = [o for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid") != uid]
            if refs:
                obj["metadata"]["ownerReferences"] = refs
            else:
                obj["metadata"].pop("ownerReferences", None)
            self._commit("MODIFIED", resource, ns, obj, old)

    # ---- convenience for scenarios -------------------------------------------

    def apply_objects(self, objects: ObjList) -> ObjList:
        """Create objects (namespaces first), replacing ones that exist."""
        created: ObjList = []
        ordered: ObjList = sorted(objects, key=lambda o: 0 if o.get("kind") in ("Namespace", "PriorityClass") else 1)
        for obj in ordered:
            rtype = resources.BY_KIND.get(str(obj.get("kind")))
            if rtype is None:
                raise errors.BadRequest(f"unsupported kind {obj.get('kind')!r}")
            try:
                created.append(self.create(rtype.plural, obj))
            except errors.AlreadyExists:
                meta = obj.get("metadata") or {}
                current = self.get(rtype.plural, meta["name"], meta.get("namespace"))
                merged = dict(obj)
                merged["metadata"] = {**current["metadata"], **meta}
                created.append(self.update(rtype.plural, merged))
        return created


# generateName's suffixes come from the store's own generator, as kube-apiserver's from its own
# (apimachinery's util/rand): the global one is anyone's to seed (Hypothesis re-seeds it for
# every example, which made the ReplicaSet controller draw the same taken name again and again).
_NAMES = random.Random()


def _generate(base: str) -> str:
    return base[:58] + "".join(_NAMES.choice(_GEN_ALPHABET) for _ in range(5))


def _default(resource: str, obj: Obj) -> None:
    """Defaults kube-apiserver fills in (the ones clients and controllers look at)."""
    spec = obj.get("spec")
    if resource == "limitranges":
        limitranges.default_limit_range(obj)
    if resource == "pods":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            _default_pod_spec(spec)
            limitranges.default_pod_requests(spec)
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            if "qosClass" not in obj["status"]:
                obj["status"]["qosClass"] = _qos(spec)
    elif resource in ("deployments", "replicasets", "statefulsets") and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        template = spec.get("template")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            _default_pod_spec(template["spec"], tolerations=False)
        if resource == "deployments":
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {})
            if isinstance(strategy, dict):
                strategy.setdefault("type", "RollingUpdate")
                if strategy["type"] == "RollingUpdate":
                    strategy.setdefault("rollingUpdate", {"maxUnavailable": "25%", "maxSurge": "25%"})
        if resource == "statefulsets":
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("updateStrategy", {"type": "RollingUpdate",
                                               "rollingUpdate": {"partition": 0}})
    for template_spec in strategies.default(resource, obj):
        _default_pod_spec(template_spec, tolerations=False)
    if resource == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
        labels = obj["metadata"].setdefault("labels", {})
        if isinstance(labels, dict) and obj["metadata"].get("name"):
            labels.setdefault("kubernetes.io/metadata.name", obj["metadata"]["name"])
    elif resource == "nodes":
        obj.setdefault("spec", {})
    elif resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for hook in obj.get("webhooks") or []:
            if not isinstance(hook, dict):
                continue
            hook.setdefault("failurePolicy", "Fail")
            hook.setdefault("matchPolicy", "Equivalent")
            hook.setdefault("namespaceSelector", {})
            hook.setdefault("objectSelector", {})
            hook.setdefault("timeoutSeconds", 10)
            if resource == "mutatingwebhookconfigurations":
                hook.setdefault("reinvocationPolicy", "Never")
            for rule in hook.get("rules") or []:
                if isinstance(rule, dict):
                    rule.setdefault("scope", "*")


def _default_pod_spec(spec: dict[str, Any], tolerations: bool = True) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for container in itertools.chain(spec.get("containers") or [], spec.get("initContainers") or []):
        if isinstance(container, dict):
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("resources", {})
    if tolerations:
        spec.setdefault("priority", 0)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("serviceAccountName", "default")
        existing = spec.setdefault("tolerations", [])
        if isinstance(existing, list):
            # the DefaultTolerationSeconds admission plugin
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(isinstance(t, dict) and t.get("key") == key for t in existing):
                    existing.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                     "tolerationSeconds": 300})


def _qos(spec: Mapping[str, Any]) -> str:
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    requests = [bool((c.get("resources") or {}).get("requests")) for c in containers]
    limits = [bool((c.get("resources") or {}).get("limits")) for c in containers]
    if containers and all(limits) and all(
        (c.get("resources") or {}).get("requests", (c.get("resources") or {}).get("limits"))
        == (c.get("resources") or {}).get("limits") for c in containers
    ):
        return "Guaranteed"
    if any(requests) or any(limits):
        return "Burstable"
    return "BestEffort"


def _check_pod_update(old: Obj, new: Obj) -> None:
    """Pod spec is mostly immutable; nodeName cannot be changed once set."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_node = old_spec.get("nodeName")
    if old_node and new_spec.get("nodeName") != old_node:
        raise errors.invalid("Pod", str(old["metadata"]["name"]), [
            {"field": "spec", "message": "Forbidden: pod updates may not change fields other "
             "than `spec.containers[*].image`, `spec.initContainers[*].image`, "
             "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
             "tolerations) or `spec.terminationGracePeriodSeconds`"}])
