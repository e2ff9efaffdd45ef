"""The thin I/O layer between spotguard and the Kubernetes API: raw JSON in, raw JSON out.

::

    from spotguard.gateway import kube, resources as r

    k = kube.connect()                      # or kube.Kube(api_client)
    pods = k.list(r.PODS, "shop", label_selector="app=web")
    k.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 4}}, "shop")
    try:
        k.replace(r.LEASES, lease)
    except kube.Conflict:
        ...                                  # re-read and recompute

Requests go through the official client's ``ApiClient.call_api`` with
``_preload_content=False`` (no model objects: listing 20,000 pods stays fast),
and every answer is a plain ``dict``. Failures raise the
:mod:`~spotguard.gateway.errors` family (re-exported here); retries follow
:mod:`~spotguard.gateway.retry`; ``k.stats`` counts every request sent.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from spotguard.gateway import errors, resources, retry, serverclock, stats
from spotguard.gateway.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    TooManyRequests,
    Transient,
    Unauthorized,
)
from spotguard.gateway.resources import Resource

__all__ = [
    "RETRY_LATER",
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "Kube",
    "NotFound",
    "TooManyRequests",
    "Transient",
    "Unauthorized",
    "connect",
]

RETRY_LATER = errors.RETRY_LATER
PATCH_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
PAGE_LIMIT = 500
# A snapshot of the whole cluster reads every pod at once: bigger pages than the default
# mean fewer round trips; kube-apiserver serves 5,000 a page without trouble.
BIG_PAGE = 5000
GC_PAUSE_BYTES = 1 << 20  # parse bodies larger than this with the garbage collector paused
POOL_MAXSIZE = 32
Obj = dict[str, Any]
Items = list[Obj]
Results = list[Any]
Query = list[tuple[str, str]]
Patch = Obj | list[Obj]

log = logging.getLogger(__name__)

try:  # orjson parses a 20,000-pod list two to three times faster than json
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    _loads = json.loads


class _GcState:
    lock = threading.Lock()
    pauses = 0  # threads inside gc_paused()
    was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector, then restore it as it was.

    Parsing a big JSON answer (20,000 pods are about 24 MB and millions of dicts, lists
    and strings) allocates objects so fast that the collector runs over and over, and
    each older-generation pass walks every object still alive: the parse itself and
    all the pages already kept. That walking, not orjson, was most of a big list's
    time. JSON trees hold no reference cycles, so the collector has nothing to find in
    them; reference counting frees them. The pause is process-wide (``gc.disable``),
    counted across threads, and the collector is re-enabled only if it was enabled
    when the first pause began (a caller that disabled it keeps it disabled).
    """
    state = _GcState
    with state.lock:
        if state.pauses == 0:
            state.was_enabled = gc.isenabled()
            gc.disable()
        state.pauses += 1
    try:
        yield
    finally:
        with state.lock:
            state.pauses -= 1
            if state.pauses == 0 and state.was_enabled:
                if gc.get_freeze_count() == 0:
                    # Move the new objects straight to the oldest generation (freeze, then
                    # unfreeze: two list splices). Otherwise the first collection after
                    # re-enabling walks every object made during the pause, a 20,000-pod
                    # list's millions of them (0.5 s). They stay collectable by the next
                    # full collection. Skipped when someone else keeps objects frozen.
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()


def connect(kubeconfig: str | None = None, *, policy: retry.Policy | None = None) -> Kube:
    """A :class:`Kube` for the configured cluster; see :mod:`spotguard.gateway.connection`."""
    from spotguard.gateway import connection

    return Kube(connection.api_client(kubeconfig), policy=policy)


class Kube:
    """Raw-JSON access to one cluster. Thread-safe; share one per process."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        policy: retry.Policy | None = None,
        counter: stats.Stats | None = None,
        page_limit: int = PAGE_LIMIT,
        server_clock: serverclock.ServerClock | None = None,
    ) -> None:
        self.api_client = api_client
        self.policy = policy or retry.DEFAULT
        self.stats = counter or stats.Stats()
        self.page_limit = page_limit
        # the API server's time, from its answers' Date headers (its timestamps are on it)
        self.server_clock = server_clock or serverclock.ServerClock()
        _tune_pool(api_client)

    def with_policy(self, policy: retry.Policy) -> Kube:
        """The same connection and counters under another retry policy (a tighter deadline)."""
        return Kube(self.api_client, policy=policy, counter=self.stats, page_limit=self.page_limit,
                    server_clock=self.server_clock)  # fmt: skip

    def server_now(self) -> float:
        """The API server's epoch seconds now (its clock, not this process's: see serverclock)."""
        return self.server_clock.now()

    # -- reads ---------------------------------------------------------------------------

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return self._call("get", res, "GET", res.path(_ns(res, namespace), name))

    def find(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None:
        """``get``, or None when the object does not exist."""
        try:
            return self.get(res, name, namespace)
        except NotFound:
            return None

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Items:
        """All items (every page, following ``continue``), with ``apiVersion`` and ``kind`` set."""
        return self.list_with_version(res, namespace, label_selector, field_selector)[0]

    def list_with_version(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[Items, str]:
        """All items and the list's ``resourceVersion`` (to start a watch from)."""
        path = res.path(namespace or None)
        base: Query = []
        if label_selector:
            base.append(("labelSelector", label_selector))
        if field_selector:
            base.append(("fieldSelector", field_selector))
        # The pages pile up in one result, so the collector is paused for the whole list
        # (waits for the server included), not page by page: re-enabled between pages, it
        # walks the pages kept so far again and again (0.58 s instead of 0.40 s for 20,000
        # pods in pages of 500 from the simulated cluster).
        with gc_paused():
            return self._list_pages(res, path, base)

    def read_concurrently(self, *reads: Resource | Callable[[Kube], Any], page_limit: int = BIG_PAGE) -> Results:
        """Run ``reads`` side by side, each on a client of this connection with pages of at
        least ``page_limit``; their results, in order.

        A :class:`Resource` is listed in every namespace; a callable gets the big-page
        client and does its reads in its own order (for reads that must come before
        others, as a budget before its workload)."""
        k = Kube(self.api_client, policy=self.policy, counter=self.stats, page_limit=max(self.page_limit, page_limit),
                 server_clock=self.server_clock)  # fmt: skip

        def run(read: Resource | Callable[[Kube], Any]) -> Any:
            return k.list(read) if isinstance(read, Resource) else read(k)

        with ThreadPoolExecutor(max_workers=max(1, len(reads))) as pool:
            return list(pool.map(run, reads))

    def _list_pages(self, res: Resource, path: str, base: Query) -> tuple[Items, str]:
        items: Items = []
        version = ""
        token = ""
        try:
            while True:
                query = [*base, ("limit", str(self.page_limit))]
                if token:
                    query.append(("continue", token))
                page = self._call("list", res, "GET", path, query=query)
                meta = page.get("metadata") or {}
                version = version or str(meta.get("resourceVersion") or "")
                items.extend(page.get("items") or [])
                token = str(meta.get("continue") or "")
                if not token:
                    break
        except Gone:
            if not token:
                raise
            # The list's resourceVersion was compacted between two pages (etcd compacts
            # every 5 minutes): list again in one request, as client-go's pager does
            # (FullListIfExpired). Paging again could expire again under a busy cluster.
            log.info("list continue token expired; listing again unpaged", extra={"resource": res.name})
            page = self._call("list", res, "GET", path, query=list(base))
            items = list(page.get("items") or [])
            version = str((page.get("metadata") or {}).get("resourceVersion") or "")
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items, version

    def scale(self, res: Resource, name: str, namespace: str) -> Obj:
        """The ``autoscaling/v1`` Scale of a Deployment, ReplicaSet or StatefulSet."""
        return self._call("get", res, "GET", res.path(namespace, name, "scale"), sub="scale")

    # -- writes --------------------------------------------------------------------------

    def create(self, res: Resource, obj: Obj, namespace: str | None = None, dry_run: bool = False) -> Obj:
        body = _with_type(res, obj)
        ns = _ns(res, namespace or (body.get("metadata") or {}).get("namespace"))
        return self._call("create", res, "POST", res.path(ns), body=body, dry_run=dry_run)

    def replace(self, res: Resource, obj: Obj, dry_run: bool = False) -> Obj:
        """PUT the whole object; its ``metadata.resourceVersion`` makes it conditional (409 Conflict)."""
        body = _with_type(res, obj)
        name, ns = _identity(res, body)
        return self._call("update", res, "PUT", res.path(ns, name), body=body, dry_run=dry_run)

    def update_status(self, res: Resource, obj: Obj, dry_run: bool = False) -> Obj:
        """PUT the ``status`` subresource (conditional on ``resourceVersion`` like :meth:`replace`)."""
        body = _with_type(res, obj)
        name, ns = _identity(res, body)
        return self._call("update", res, "PUT", res.path(ns, name, "status"), body=body, dry_run=dry_run, sub="status")

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Patch,
        namespace: str | None = None,
        patch_type: str = "merge",
        *,
        dry_run: bool = False,
        subresource: str | None = None,
    ) -> Obj:
        """PATCH with a merge patch (dict), a JSON patch (list of ops) or a strategic merge patch."""
        try:
            content_type = PATCH_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"patch_type must be one of {sorted(PATCH_TYPES)}, not {patch_type!r}") from None
        if (patch_type == "json") != isinstance(patch, list):
            raise ValueError("a JSON patch is a list of operations; merge and strategic patches are objects")
        return self._call(
            "patch",
            res,
            "PATCH",
            res.path(_ns(res, namespace), name, subresource),
            body=patch,
            content_type=content_type,
            dry_run=dry_run,
            sub=subresource,
        )

    def set_scale(self, res: Resource, name: str, namespace: str, replicas: int, dry_run: bool = False) -> Obj:
        """Set ``spec.replicas`` through the scale subresource (as ``kubectl scale`` does)."""
        if replicas < 0:
            raise ValueError("replicas must not be negative")
        return self.patch(res, name, {"spec": {"replicas": replicas}}, namespace, dry_run=dry_run, subresource="scale")

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> Obj:
        """DELETE; ``resource_version``/``uid`` become preconditions (409 Conflict when stale)."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        return self._call("delete", res, "DELETE", res.path(_ns(res, namespace), name), body=options, dry_run=dry_run)

    def evict(
        self,
        name: str,
        namespace: str,
        dry_run: bool = False,
        grace_period_seconds: int | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """POST a ``policy/v1`` Eviction for a pod.

        A PodDisruptionBudget that forbids it answers 429: :class:`TooManyRequests` is raised at
        once (no waiting here), with ``retry_after`` set from the server's hint.
        ``uid``/``resource_version`` become the deletion's preconditions (409 Conflict when the
        pod is another one, or changed since it was read).
        """
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: Obj = {}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if options:
            body["deleteOptions"] = options
        return self._call(
            "create",
            resources.PODS,
            "POST",
            resources.PODS.path(namespace, name, "eviction"),
            body=body,
            dry_run=dry_run,
            sub="eviction",
            retry_429=False,
        )

    def create_event(
        self,
        involved_object: Mapping[str, Any],
        reason: str,
        message: str,
        type: str = "Normal",
        component: str = "spotguard",
        *,
        action: str | None = None,
        best_effort: bool = False,
    ) -> Obj | None:
        """Write a ``core/v1`` Event about an object (a full object or an ObjectReference).

        ``best_effort=True`` logs a failure and returns None instead of raising.
        """
        if type not in ("Normal", "Warning"):
            raise ValueError("event type must be Normal or Warning")
        ref = object_reference(involved_object)
        now = datetime.datetime.now(datetime.UTC)
        seconds = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = ref.get("namespace") or "default"
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": component, "host": _HOST},
            "firstTimestamp": seconds,
            "lastTimestamp": seconds,
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "count": 1,
            "action": (action or reason)[:128],
            "reportingComponent": component,
            "reportingInstance": _HOST[:128],
        }
        try:
            return self.create(resources.EVENTS, event, namespace)
        except ApiError as exc:
            if not best_effort:
                raise
            log.warning(
                "could not write event",
                extra={"reason": reason, "object": ref.get("name"), "error": str(exc)},
            )
            return None

    # -- the request ---------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        res: Resource,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        dry_run: bool = False,
        sub: str | None = None,
        retry_429: bool = True,
    ) -> Obj:
        query = [*(query or [])]
        if dry_run:
            query.append(("dryRun", "All"))
        write = verb in stats.WRITE_VERBS
        counted = f"{res.name}/{sub}" if sub else res.name
        policy = self.policy
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            remaining = policy.deadline - (time.monotonic() - started)
            timeout = max(0.05, min(policy.timeout, remaining))
            try:
                return self._once(
                    verb=verb,
                    counted=counted,
                    method=method,
                    path=path,
                    query=query,
                    body=body,
                    content_type=content_type,
                    timeout=timeout,
                    policy=policy,
                )
            except ApiError as exc:
                if attempt >= policy.attempts or not retry.retryable(exc, write=write, retry_429=retry_429):
                    raise
                pause = policy.delay(attempt, exc.retry_after)
                if time.monotonic() - started + pause >= policy.deadline:
                    raise
                log.debug(
                    "retrying kubernetes request",
                    extra={"verb": verb, "resource": counted, "attempt": attempt, "error": str(exc)},
                )
                self.stats.record_retry(verb, counted)
                time.sleep(pause)

    def _once(
        self,
        *,
        verb: str,
        counted: str,
        method: str,
        path: str,
        query: Query,
        body: Any,
        content_type: str,
        timeout: float,
        policy: retry.Policy,
    ) -> Obj:
        code = 0
        try:
            response = self.api_client.call_api(
                path,
                method,
                query_params=query,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=(min(policy.connect_timeout, timeout), timeout),
            )
            try:
                raw = response.data
                code = response.status
                self.server_clock.observe(response.headers.get("Date"))
            finally:
                response.release_conn()
        except ApiException as exc:
            code = int(exc.status or 0)
            raise _from_api_exception(exc) from exc
        except AttributeError as exc:
            # The client's call_api decodes ``ApiException.body``, which is None when it raised
            # the exception itself (a TLS failure): the ApiException is the context.
            if not isinstance(exc.__context__, ApiException):
                raise
            raise _from_api_exception(exc.__context__) from exc.__context__
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _from_transport(exc, f"{method} {path}") from exc
        finally:
            self.stats.record(verb, counted, code)
        if not raw:
            return {}
        try:
            if len(raw) > GC_PAUSE_BYTES:
                with gc_paused():
                    decoded = _loads(raw)
            else:
                decoded = _loads(raw)
        except ValueError as exc:
            raise Transient(code, "BadResponse", f"answer is not JSON: {raw[:120]!r}") from exc
        if not isinstance(decoded, dict):
            raise Transient(code, "BadResponse", "answer is not a JSON object")
        return decoded


def object_reference(obj: Mapping[str, Any]) -> Obj:
    """An ObjectReference for a full object, or a copy of one that already is a reference."""
    if "metadata" in obj:
        meta = obj.get("metadata") or {}
        ref = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        }
    else:
        keys = ("apiVersion", "kind", "name", "namespace", "uid", "resourceVersion", "fieldPath")
        ref = {k: obj.get(k) for k in keys}
    ref = {k: v for k, v in ref.items() if v}
    if not ref.get("name") or not ref.get("kind"):
        raise ValueError("an event needs an involved object with a kind and a name")
    return ref


_HOST = os.environ.get("HOSTNAME") or socket.gethostname() or "spotguard"


def _ns(res: Resource, namespace: str | None) -> str | None:
    if res.namespaced and not namespace:
        raise ValueError(f"{res.kind} is namespaced: give a namespace")
    return namespace if res.namespaced else None


def _identity(res: Resource, obj: Obj) -> tuple[str, str | None]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError(f"{res.kind} has no metadata.name")
    return str(name), _ns(res, meta.get("namespace"))


def _with_type(res: Resource, obj: Obj) -> Obj:
    if not isinstance(obj, dict):
        raise TypeError("objects are dicts")
    if obj.get("apiVersion") and obj.get("kind"):
        return obj
    return {"apiVersion": res.api_version, "kind": res.kind, **obj}


def _from_api_exception(exc: ApiException) -> ApiError:
    status = int(exc.status or 0)
    if status == 0:
        # The client raises status 0 for TLS failures (bad CA, wrong host): not transient.
        return ApiError(0, "TLSError", str(exc.reason or "TLS failure").strip())
    headers = exc.headers or {}
    retry_after = headers.get("Retry-After") if hasattr(headers, "get") else None
    return errors.from_response(status, exc.body, str(exc.reason or ""), retry_after)


def _from_transport(exc: BaseException, request: str) -> ApiError:
    """The error for a request that got no HTTP answer, naming the request (``GET /api/v1/...``):
    a timeout says which call the API server did not answer in time."""
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    error: ApiError
    if isinstance(cause, urllib3.exceptions.ConnectTimeoutError):  # NewConnectionError too
        error = Transient(0, "ConnectionFailed", f"{request}: {cause}")
        error.request_sent = False  # type: ignore[attr-defined]
    elif isinstance(cause, urllib3.exceptions.TimeoutError | TimeoutError):
        error = Transient(0, "Timeout", f"{request}: {cause}")
    elif isinstance(cause, urllib3.exceptions.SSLError):
        error = ApiError(0, "TLSError", f"{request}: {cause}")
    else:
        error = Transient(0, "ConnectionError", f"{request}: {cause}")
    return error


def _tune_pool(api_client: ApiClient) -> None:
    """Leave retries to the gateway (urllib3 would retry on its own) and allow concurrency."""
    rest = getattr(api_client, "rest_client", None)
    manager = getattr(rest, "pool_manager", None)
    pool_kw = getattr(manager, "connection_pool_kw", None)
    if manager is None or not isinstance(pool_kw, dict):
        return
    if pool_kw.get("retries") is False and pool_kw.get("maxsize", 0) >= POOL_MAXSIZE:
        return
    pool_kw["retries"] = False
    pool_kw["maxsize"] = max(int(pool_kw.get("maxsize") or 1), POOL_MAXSIZE)
    manager.clear()
