"""The REST routes of the simulated API server: a request in, a response out.

Paths follow https://kubernetes.io/docs/reference/using-api/api-concepts/ :
``/api/v1/namespaces/{ns}/pods/{name}/{subresource}``,
``/apis/{group}/{version}/...``; verbs map from HTTP methods as kube-apiserver
maps them (GET one = get, GET a collection = list or watch, POST = create,
PUT = update, PATCH = patch, DELETE = delete / deletecollection).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import orjson

from spotguard_sim import discovery, errors, partialmeta, patching, resources, selectors, tables, wire
from spotguard_sim.wire import Obj, Request, Response, Target, json_response, resolve, status_response, success

if TYPE_CHECKING:
    from spotguard_sim.store import Store

log = logging.getLogger("spotguard.sim.routes")
# the watch cache sends a bookmark about once a minute to watchers that allow them
# (staging/src/k8s.io/apiserver/pkg/storage/cacher: bookmarkFrequency = time.Minute)
BOOKMARK_SECONDS = 60.0

# staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go (handleCompactedErrorForPaging)
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this response "
    "to retrieve the remainder of the results. Continuing with the provided token results in an "
    "inconsistent list - objects that were created, modified, or deleted between the time the "
    "first chunk was returned and now may show up in the list."
)


def _continue_token(rv: int, after: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps({
        "rv": rv, "ns": after[0], "name": after[1]}).encode()).decode()


def _check_continue(store: Store, rv: int, after: tuple[str, str]) -> None:
    """A continue token whose list's resourceVersion is compacted is 410 Expired, carrying
    a token (resourceVersion -1) that continues the list inconsistently, at the latest."""
    try:
        store.check_not_compacted(rv, CONTINUE_EXPIRED)
    except errors.Gone as exc:
        exc.list_meta = {"continue": _continue_token(-1, after)}
        raise


class Api:
    """Serve REST requests from a Store."""

    def __init__(self, store: Store) -> None:
        from spotguard_sim import authn, rbac

        self.store = store
        self.authorizer = rbac.Authorizer(store)
        self.authenticator = authn.Authenticator(store)

    # ---- entry point -----------------------------------------------------
    def handle(self, request: Request) -> Response:
        try:
            doc: Response | None = discovery.serve(request.path, request.headers.get("accept", ""))
            if doc is not None:
                return doc
            target = resolve(request.path)
            if target is None:
                raise errors.generic_not_found()
            return self._dispatch(request, target)
        except errors.StatusError as exc:
            return status_response(exc)

    def _dispatch(self, request: Request, t: Target) -> Response:
        method = request.method
        q = request.query
        ctype = request.headers.get("content-type", "")
        reviewed = t.rtype in resources.REVIEWS or t.subresource == "token"  # answered, never stored
        if request.body and "protobuf" in ctype and reviewed:
            from spotguard_sim import protobuf

            request.body = orjson.dumps(protobuf.decode(request.body))
        elif request.body and ("protobuf" in ctype or "cbor" in ctype):
            raise errors.UnsupportedMediaType(
                f"the simulated cluster speaks JSON only, not {ctype.split(';')[0]} (kubectl's "
                "imperative `create <kind>` generators send protobuf: use `kubectl apply -f` or "
                "`kubectl create -f`)"
            )
        if t.rtype is resources.EVENTS_V1:
            from spotguard_sim import eventshandlers

            return eventshandlers.handle(self, request, t)
        if reviewed:
            from spotguard_sim import accessreviews

            return accessreviews.handle(self, request, t)
        if t.subresource == "eviction":
            if method != "POST":
                raise errors.generic_method_not_allowed()  # only POST is routed
            return self._evict(request, t)
        if t.subresource == "binding":
            if method != "POST":
                raise errors.generic_method_not_allowed()  # only POST is routed
            return self._bind(request, t)
        if t.subresource == "scale":
            return self._scale(request, t)
        if method == "GET":
            if t.name is None:
                if wire.true(q.get("watch")):
                    return self._watch(request, t)
                return self._list(request, t)
            partial = partialmeta.requested(request.headers.get("accept", ""))
            raw = self.store.get_raw(t.rtype.plural, t.name, t.namespace)
            if partial is not None:
                return json_response(200, partialmeta.of_object(orjson.loads(raw), partial))
            if tables.wants_table(request.headers.get("accept", "")):
                obj = orjson.loads(raw)
                return json_response(200, tables.table(
                    t.rtype, [obj], self.store.resource_version, q.get("includeObject"),
                    self.store.clock.now(),
                ))
            return Response(200, raw + b"\n")
        if method == "POST":
            if t.name is not None:
                raise errors.generic_method_not_allowed()
            obj = wire.load(request.body)
            if not isinstance(obj, dict):
                raise errors.BadRequest("the request body must be a JSON object")
            wire.strict(t.rtype, q, obj)
            if t.rtype.has_status and t.rtype.plural != "nodes":
                # kube-apiserver's PrepareForCreate drops the status a client sends
                obj.pop("status", None)
            created = self.store.create(
                t.rtype.plural, obj, namespace=t.namespace, dry_run=wire.dry_run(q),
                user=request.user,
            )
            return json_response(201, created)
        if method == "PUT":
            if t.name is None:
                raise errors.generic_method_not_allowed()
            obj = wire.load(request.body)
            if not isinstance(obj, dict):
                raise errors.BadRequest("the request body must be a JSON object")
            wire.strict(t.rtype, q, obj)
            meta = obj.setdefault("metadata", {})
            if meta.get("name") not in (None, t.name):
                raise errors.BadRequest(
                    f"the name of the object ({meta.get('name')}) does not match the name on "
                    f"the URL ({t.name})"
                )
            meta["name"] = t.name
            updated = self.store.update(
                t.rtype.plural, obj, dry_run=wire.dry_run(q), subresource=t.subresource,
                namespace=t.namespace, user=request.user,
            )
            return json_response(200, updated)
        if method == "PATCH":
            if t.name is None:
                raise errors.generic_method_not_allowed()
            ctype = request.headers.get("content-type", "").split(";")[0].strip()
            patch_type = patching.CONTENT_TYPES.get(ctype)
            if patch_type is None:
                raise errors.UnsupportedMediaType(
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(patching.CONTENT_TYPES)}"
                )
            if patch_type == "apply":  # refused whether or not the object exists (no 404 first)
                raise errors.UnsupportedMediaType(patching.APPLY_NOT_SERVED)
            patch = wire.load(request.body)
            if patch_type in ("merge", "strategic"):
                wire.strict(t.rtype, q, patch)
            patched = self.store.patch(
                t.rtype.plural, t.name, patch, patch_type, namespace=t.namespace,
                dry_run=wire.dry_run(q), subresource=t.subresource, user=request.user,
            )
            return json_response(200, patched)
        if method == "DELETE":
            options = wire.load(request.body) if request.body.strip() else {}
            if not isinstance(options, dict):
                raise errors.BadRequest("DeleteOptions must be a JSON object")
            grace = q.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            policy = q.get("propagationPolicy", options.get("propagationPolicy"))
            if wire.true(q.get("orphanDependents")) or options.get("orphanDependents") is True:
                policy = "Orphan"
            kwargs: dict[str, Any] = {
                "dry_run": wire.dry_run(q, options),
                "grace_period_seconds": int(grace) if grace not in (None, "") else None,
                "preconditions": options.get("preconditions"),
                "propagation_policy": policy,
                "user": request.user,
            }
            if t.name is None:
                entries, _ = self.store.list_entries(
                    t.rtype.plural, t.namespace, q.get("labelSelector"), q.get("fieldSelector")
                )
                for entry in entries:
                    meta = entry.obj["metadata"]
                    with contextlib.suppress(errors.NotFound):
                        self.store.delete(t.rtype.plural, meta["name"], meta.get("namespace"),
                                          **kwargs)
                return success(200)
            deleted = self.store.delete(t.rtype.plural, t.name, t.namespace, **kwargs)
            meta = deleted.get("metadata") or {}
            if t.rtype.plural == "pods" or meta.get("deletionTimestamp"):
                return json_response(200, deleted)  # pods return the object (ReturnDeletedObject)
            return success(200, {"name": t.name, "group": t.rtype.group,
                                 "kind": t.rtype.plural, "uid": meta.get("uid", "")})
        raise errors.generic_method_not_allowed()

    # ---- list and watch ---------------------------------------------------
    def _list(self, request: Request, t: Target) -> Response:
        q = request.query
        limit = 0
        limit_text = q.get("limit")
        if limit_text:
            try:
                limit = int(limit_text)
            except ValueError:
                raise errors.BadRequest(f"invalid limit {limit_text!r}") from None
        after: tuple[str, str] | None = None
        token_rv: int | None = None
        token = q.get("continue")
        if token:
            try:
                start = json.loads(base64.urlsafe_b64decode(token.encode()))
                after = (str(start["ns"]), str(start["name"]))
                token_rv = int(start["rv"]) if "rv" in start else None
            except Exception:
                raise errors.BadRequest("continue key is not valid") from None
            if token_rv is not None and token_rv < 0:
                token_rv = None  # the token of an expired list: continue at the latest
            elif token_rv is not None:
                _check_continue(self.store, token_rv, after)
        from spotguard_sim import snapshots

        partial = partialmeta.requested(request.headers.get("accept", ""))
        exact = snapshots.check(q, int(self.store.resource_version))
        # one page from the sorted key index: O(log n + limit), not a sorted copy of all
        page = self.store.list_page(
            t.rtype.plural, t.namespace, q.get("labelSelector"), q.get("fieldSelector"),
            after=after, limit=limit,
        )
        if exact is not None:  # resourceVersionMatch=Exact at an older resourceVersion
            found = snapshots.entries_at(self.store, t.rtype.plural, t.namespace,
                                         label_selector=q.get("labelSelector"),
                                         field_selector=q.get("fieldSelector"), rv=exact[1])
            more = 0 < limit < len(found)
            page = page._replace(entries=found[:limit] if more else found, resource_version=exact[1],
                                 more=more, remaining=None)
        entries = page.entries
        # every page of a list carries the first page's resourceVersion, as upstream
        rv = token_rv if token_rv is not None else page.resource_version
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if page.more:
            last = entries[-1].obj["metadata"]
            meta["continue"] = _continue_token(rv, (last.get("namespace", ""), last["name"]))
            if page.remaining is not None:
                meta["remainingItemCount"] = page.remaining
        if partial is not None:
            return json_response(200, partialmeta.of_list([orjson.loads(e.raw) for e in entries], partial, meta))
        if tables.wants_table(request.headers.get("accept", "")):
            objs = [e.copy() for e in entries]
            table = tables.table(t.rtype, objs, str(rv), q.get("includeObject"),
                                 self.store.clock.now())
            table["metadata"].update({k: v for k, v in meta.items() if k != "resourceVersion"})
            return json_response(200, table)
        head = orjson.dumps({
            "kind": t.rtype.list_kind, "apiVersion": t.rtype.api_version, "metadata": meta,
        })
        body = b"".join((head[:-1], b',"items":[', b",".join(e.raw for e in entries), b"]}\n"))
        return Response(200, body)

    def _watch(self, request: Request, t: Target) -> Response:
        q = request.query
        partial = partialmeta.requested(request.headers.get("accept", ""))
        rv = q.get("resourceVersion")
        initial = q.get("sendInitialEvents") == "true"
        if initial:
            rv = None
        try:
            watcher = self.store.watch(
                t.rtype.plural, t.namespace, rv, q.get("labelSelector"), q.get("fieldSelector"),
                initial_events_end=initial,
            )
        except errors.Gone as exc:
            # the watch cache answers a too old resourceVersion with a watch that sends one
            # ERROR event and ends (cacher.go: newErrWatcher), not with an HTTP 410
            from spotguard_sim import store as store_mod

            return Response(200, b"", watch=store_mod.Watcher.failed(
                self.store, t.rtype.plural, exc.status()))
        timeout = None
        if q.get("timeoutSeconds"):
            try:
                timeout = float(q["timeoutSeconds"])
            except ValueError:
                watcher.close()
                raise errors.BadRequest("invalid timeoutSeconds") from None
        transform = None
        if partial is not None and partial[0] == partialmeta.OBJECT:
            target = partial

            def transform(raw: bytes) -> bytes:
                return orjson.dumps(partialmeta.of_object(orjson.loads(raw), target))
        elif tables.wants_table(request.headers.get("accept", "")):
            clock, rtype, include = self.store.clock, t.rtype, q.get("includeObject")

            def transform(raw: bytes) -> bytes:
                obj = orjson.loads(raw)
                rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                return orjson.dumps(tables.table(rtype, [obj], rv, include, clock.now()))

        bookmark = None
        if wire.true(q.get("allowWatchBookmarks")):
            store, rtype = self.store, t.rtype

            kind, api_version = rtype.kind, rtype.api_version
            if partial is not None and partial[0] == partialmeta.OBJECT:
                kind, api_version = partial

            def bookmark() -> bytes:
                return orjson.dumps({"kind": kind, "apiVersion": api_version,
                                     "metadata": {"resourceVersion": store.resource_version}})

        return Response(200, b"", watch=watcher, watch_timeout=timeout, watch_transform=transform,
                        watch_bookmark=bookmark,
                        watch_bookmark_seconds=max(self.store.clock.real(BOOKMARK_SECONDS), 0.05))

    # ---- subresources -----------------------------------------------------
    def _evict(self, request: Request, t: Target) -> Response:
        assert t.name is not None and t.namespace is not None
        body = wire.load(request.body) if request.body.strip() else {}
        if not isinstance(body, dict):
            raise errors.BadRequest("the Eviction must be a JSON object")
        name = (body.get("metadata") or {}).get("name")
        if name and name != t.name:
            raise errors.BadRequest(
                f"name in URL does not match name in Eviction object: {t.name} != {name}"
            )
        if wire.dry_run(request.query, body.get("deleteOptions") or {}):
            # As kube-apiserver: a dry-run eviction still checks the budgets (429 when
            # one would break) but neither spends a disruption nor deletes the pod.
            body = {**body, "deleteOptions": {**(body.get("deleteOptions") or {}), "dryRun": ["All"]}}
        from spotguard_sim import admission, disruption

        admission.admit(self.store, "pods", {"apiVersion": "policy/v1", "kind": "Eviction", **body},
                        namespace=t.namespace, user=request.user, dry_run=wire.dry_run(request.query),
                        subresource="eviction")
        disruption.evict(self.store, t.namespace, t.name, body, user=request.user)
        return success(201)

    def _bind(self, request: Request, t: Target) -> Response:
        body = wire.load(request.body)
        if not isinstance(body, dict):
            raise errors.BadRequest("a Binding must be a JSON object")
        node = (body.get("target") or {}).get("name")
        if not node:
            raise errors.BadRequest("a Binding needs target.name")
        name = t.name or (body.get("metadata") or {}).get("name")
        if not name:
            raise errors.BadRequest("a Binding needs metadata.name (the pod)")

        def bind(pod: Obj) -> None:
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise errors.conflict("pods/binding", name, err=f"pod {name} is already assigned to node "
                                      f"\"{spec['nodeName']}\"")
            if pod["metadata"].get("deletionTimestamp"):
                raise errors.conflict("pods/binding", name,
                                      err=f"pod {name} is being deleted, cannot be assigned to a host")
            spec["nodeName"] = node
            status = pod.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True",
                               "lastProbeTime": None,
                               "lastTransitionTime": self.store.clock.iso()})
            status["conditions"] = conditions

        if wire.dry_run(request.query):
            self.store.get("pods", name, t.namespace)
            return success(201)
        self.store.mutate("pods", name, t.namespace, bind)
        return success(201)

    def _scale(self, request: Request, t: Target) -> Response:
        assert t.name is not None
        plural = t.rtype.plural
        obj = self.store.get(plural, t.name, t.namespace)
        if request.method == "GET":
            return json_response(200, to_scale(obj))
        if request.method not in ("PUT", "PATCH"):
            raise errors.generic_method_not_allowed()
        current = to_scale(obj)
        if request.method == "PUT":
            wanted = wire.load(request.body)
        else:
            ctype = request.headers.get("content-type", "").split(";")[0].strip()
            patch_type = patching.CONTENT_TYPES.get(ctype)
            if patch_type is None:
                raise errors.UnsupportedMediaType(f"unsupported patch type {ctype!r}")
            wanted = patching.apply(current, wire.load(request.body), patch_type)
        if not isinstance(wanted, dict):
            raise errors.BadRequest("the Scale must be a JSON object")
        from spotguard_sim import admission

        # webhooks see the Scale (rules on <resource>/scale), not the workload
        wanted = admission.admit(self.store, plural, {**wanted, "kind": "Scale", "apiVersion": "autoscaling/v1"},
                                 namespace=t.namespace or "", user=request.user,
                                 dry_run=wire.dry_run(request.query), operation="UPDATE", old=current,
                                 subresource="scale")
        replicas = (wanted.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid("Scale", t.name, [{
                "field": "spec.replicas",
                "message": f"Invalid value: {replicas!r}: must be greater than or equal to 0",
            }], "autoscaling")
        rv = (wanted.get("metadata") or {}).get("resourceVersion")
        if request.method == "PATCH":
            rv = None if rv == current["metadata"]["resourceVersion"] else rv
        obj["spec"]["replicas"] = replicas
        obj["metadata"]["resourceVersion"] = rv or ""
        updated = self.store.update(plural, obj, dry_run=wire.dry_run(request.query),
                                    namespace=t.namespace, subresource="scale")
        return json_response(200, to_scale(updated))


def to_scale(obj: Obj) -> Obj:
    """The autoscaling/v1 Scale of a Deployment, ReplicaSet or StatefulSet."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector = selectors.from_dict(spec.get("selector") or {})
    parts = []
    for r in selector.requirements:
        if r.op == "=":
            parts.append(f"{r.key}={r.values[0]}")
        elif r.op in ("in", "notin"):
            parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
        elif r.op == "exists":
            parts.append(r.key)
        elif r.op == "!":
            parts.append(f"!{r.key}")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                           "creationTimestamp") if k in meta},
        "spec": {"replicas": spec.get("replicas", 0)},
        "status": {"replicas": status.get("replicas", 0), "selector": ",".join(parts)},
    }
