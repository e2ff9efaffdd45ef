"""Mutating admission: call MutatingWebhookConfigurations, as kube-apiserver does.

Operations: CREATE (``admit_create``), UPDATE of an object or its ``status``
subresource and DELETE (``admit``, called by the store's update, patch and
delete), and CREATE of the ``pods/eviction`` subresource. Rules match
``resources`` as upstream: ``pods`` is the resource only, ``pods/status`` and
``pods/*`` its subresources, ``*`` every resource, ``*/*`` everything.
Writes the in-process controllers make (``store.mutate``) are not reviewed.

Follows https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/ :
webhooks run in order (configurations sorted by name, then their webhooks in
order); each matching webhook gets an AdmissionReview ``admission.k8s.io/v1``
over HTTPS (``clientConfig.url``, verified against ``caBundle``), within
``timeoutSeconds``; a JSONPatch response is applied; a denial rejects the
request; a call error rejects it under ``failurePolicy: Fail`` and is ignored
under ``Ignore``. With ``reinvocationPolicy: IfNeeded`` a webhook runs again
(once) when a later webhook changed the object. Webhooks with ``sideEffects``
other than None/NoneOnDryRun are not called for dry-run requests (the request
is rejected, as kube-apiserver does).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import jsonpatch
import orjson
import requests
import requests.adapters

from spotguard_sim import errors, resources, selectors

if TYPE_CHECKING:
    from spotguard_sim.store import Store

log = logging.getLogger("spotguard.sim.admission")

Obj = dict[str, Any]
ANONYMOUS = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
_sessions = threading.local()
_ca_files: dict[str, str] = {}
_ca_lock = threading.Lock()


MUTATING = "mutatingwebhookconfigurations"
VALIDATING = "validatingwebhookconfigurations"


class CallError(Exception):
    """Calling a webhook failed (connection, TLS, timeout, bad response)."""


class Calls:
    """How many webhook calls this API server made, and how many of them failed
    (kube-apiserver's ``apiserver_admission_webhook_request_total`` and
    ``..._rejection_count{error_type="calling_webhook_error"}``), by webhook name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.made: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.causes: dict[str, int] = {}  # what the failed calls ran into (ReadTimeout, ConnectionError, ...)

    def count(self, webhook: str, *, failed: BaseException | None = None) -> None:
        with self._lock:
            self.made[webhook] = self.made.get(webhook, 0) + 1
            if failed is not None:
                self.failed[webhook] = self.failed.get(webhook, 0) + 1
                cause = type(failed.__cause__ or failed).__name__
                self.causes[cause] = self.causes.get(cause, 0) + 1

    def total(self) -> tuple[int, int]:
        """(calls made, calls failed) over every webhook."""
        with self._lock:
            return sum(self.made.values()), sum(self.failed.values())

    def reset(self) -> None:
        with self._lock:
            self.made.clear()
            self.failed.clear()
            self.causes.clear()


CALLS = Calls()


def _session() -> requests.Session:
    session: requests.Session | None = getattr(_sessions, "session", None)
    if session is None:
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=8, pool_maxsize=8, max_retries=0)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        session.trust_env = False
        _sessions.session = session
    return session


def _ca_file(ca_bundle: str) -> str:
    """A file holding the PEM of a caBundle (base64 in the configuration), cached."""
    key = hashlib.sha256(ca_bundle.encode()).hexdigest()
    with _ca_lock:
        path = _ca_files.get(key)
        if path and os.path.exists(path):
            return path
        try:
            pem = base64.b64decode(ca_bundle, validate=True)
        except (ValueError, TypeError) as exc:
            raise CallError(f"caBundle is not valid base64: {exc}") from exc
        try:
            ssl.create_default_context(cadata=pem.decode())
        except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
            raise CallError(f"caBundle does not hold a PEM certificate: {exc}") from exc
        fd, path = tempfile.mkstemp(prefix="spotguard-sim-ca-", suffix=".pem")
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        if not _ca_files:
            atexit.register(_remove_ca_files)
        _ca_files[key] = path
        return path


def _remove_ca_files() -> None:
    """The cached CA files go with the process (they used to pile up in the temp folder)."""
    with _ca_lock:
        for path in _ca_files.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        _ca_files.clear()


def _rule_matches(rule: Mapping[str, Any], rtype: resources.ResourceType, operation: str,
                  namespaced: bool, subresource: str | None = None) -> bool:
    def has(values: Any, value: str) -> bool:
        return isinstance(values, list) and ("*" in values or value in values)

    if not has(rule.get("operations"), operation):
        return False
    if not has(rule.get("apiGroups"), rtype.group):
        return False
    if not has(rule.get("apiVersions"), rtype.version):
        return False
    wanted = rule.get("resources") or []
    names: tuple[str, ...] = ("*", "*/*", rtype.plural)
    if subresource:
        names = ("*/*", f"{rtype.plural}/*", f"*/{subresource}", f"{rtype.plural}/{subresource}")
    if not any(r in names for r in wanted):
        return False
    scope = rule.get("scope", "*")
    if scope == "Namespaced" and not namespaced:
        return False
    return not (scope == "Cluster" and namespaced)


def _webhooks(store: Store, kind: str = MUTATING) -> list[Obj]:
    configs, _ = store.list(kind)
    hooks: list[Obj] = []
    for config in sorted(configs, key=lambda c: c["metadata"]["name"]):
        for hook in config.get("webhooks") or []:
            if isinstance(hook, dict):
                hooks.append({**hook, "_configuration": config["metadata"]["name"]})
    return hooks


def _matches(store: Store, hook: Mapping[str, Any], rtype: resources.ResourceType,  # noqa: PLR0917
             obj: Mapping[str, Any], namespace: str, operation: str = "CREATE",
             subresource: str | None = None) -> bool:
    if not any(_rule_matches(r, rtype, operation, rtype.namespaced, subresource)
               for r in hook.get("rules") or [] if isinstance(r, dict)):
        return False
    object_selector = hook.get("objectSelector")
    if object_selector and not selectors.from_dict(object_selector).matches(
        (obj.get("metadata") or {}).get("labels")
    ):
        return False
    ns_selector = hook.get("namespaceSelector")
    if ns_selector:
        if rtype.plural == "namespaces":
            labels = (obj.get("metadata") or {}).get("labels")
        elif rtype.namespaced:
            try:
                labels = store.get("namespaces", namespace)["metadata"].get("labels")
            except errors.NotFound:
                labels = {}
        else:
            return True  # cluster-scoped objects are never filtered by namespaceSelector
        if not selectors.from_dict(ns_selector).matches(labels):
            return False
    return True


_OPTIONS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


def review(rtype: resources.ResourceType, obj: Obj | None, *, namespace: str,
           user: Mapping[str, Any], dry_run: bool, operation: str = "CREATE",
           old: Obj | None = None, subresource: str | None = None, name: str = "") -> Obj:
    """The AdmissionReview request kube-apiserver sends."""
    group, version, kind = resources.SUBRESOURCE_KINDS.get(subresource or "", (rtype.group, rtype.version, rtype.kind))
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": rtype.group, "version": rtype.version, "resource": rtype.plural}
    request: Obj = {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": name or ((obj or old or {}).get("metadata") or {}).get("name") or "",
        "operation": operation,
        "userInfo": dict(user),
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"kind": _OPTIONS.get(operation, "CreateOptions"), "apiVersion": "meta.k8s.io/v1"},
    }
    if subresource:
        request["subResource"] = request["requestSubResource"] = subresource
    if rtype.namespaced:
        request["namespace"] = namespace
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def call(hook: Mapping[str, Any], body: Obj) -> Obj:
    """POST the AdmissionReview to the webhook; the ``response`` part of its answer."""
    client = hook.get("clientConfig") or {}
    url = client.get("url")
    if not url:
        if client.get("service"):
            raise CallError(
                "clientConfig.service is not supported by the simulated cluster (it has no "
                "service network); use clientConfig.url"
            )
        raise CallError("clientConfig has no url")
    parts = urlsplit(str(url))
    if parts.scheme != "https":
        raise CallError(f"webhook URL must use https, got {url!r}")
    verify: str | bool = True
    if client.get("caBundle"):
        verify = _ca_file(str(client["caBundle"]))
    timeout = float(hook.get("timeoutSeconds") or 10)
    # kube-apiserver tells the webhook its timeout in the URL (a Go duration).
    url = f"{url}{'&' if parts.query else '?'}timeout={timeout:g}s"
    try:
        reply = _session().post(
            str(url),
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            timeout=timeout,
            verify=verify,
        )
    except requests.Timeout as exc:
        raise CallError(f"failed calling webhook: context deadline exceeded ({exc})") from exc
    except requests.RequestException as exc:
        raise CallError(f"failed calling webhook: {exc}") from exc
    if reply.status_code != 200:
        raise CallError(f"webhook answered HTTP {reply.status_code}: {reply.text[:200]}")
    try:
        answer = orjson.loads(reply.content)
    except orjson.JSONDecodeError as exc:
        raise CallError(f"webhook answer is not JSON: {exc}") from exc
    if not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
        raise CallError("webhook answer has no response")
    if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
        raise CallError("webhook answer is not an admission.k8s.io/v1 AdmissionReview")
    response: Obj = answer["response"]
    if response.get("uid") != body["request"]["uid"]:
        raise CallError(
            f"expected response.uid={body['request']['uid']!r}, got {response.get('uid')!r}"
        )
    return response


def _conditions_match(hook: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Evaluate the webhook's CEL ``matchConditions``: all true means call it.

    An evaluation error is a call error (failurePolicy decides), as kube-apiserver does.
    """
    conditions = hook.get("matchConditions") or []
    if not conditions:
        return True
    from spotguard_sim import cel

    env = {"object": request.get("object"), "oldObject": request.get("oldObject"),
           "request": dict(request)}
    for condition in conditions:
        name = condition.get("name", "") if isinstance(condition, dict) else ""
        expression = str(condition.get("expression", "")) if isinstance(condition, dict) else ""
        try:
            result = cel.evaluate(expression, env)
        except cel.CelError as exc:
            raise CallError(f"matchCondition {name!r} could not be evaluated: {exc}") from exc
        if result is not True:
            if result is not False:
                raise CallError(f"matchCondition {name!r} did not evaluate to a bool")
            return False
    return True


def _apply(obj: Obj, response: Mapping[str, Any]) -> Obj:
    patch = response.get("patch")
    if not patch:
        return obj
    if response.get("patchType") != "JSONPatch":
        raise CallError(f"unsupported patchType {response.get('patchType')!r}")
    try:
        ops = orjson.loads(base64.b64decode(patch))
        patched = jsonpatch.JsonPatch(ops).apply(obj, in_place=False)
    except Exception as exc:
        raise CallError(f"webhook patch cannot be applied: {exc}") from exc
    if not isinstance(patched, dict):
        raise CallError("webhook patch replaced the object with a non-object")
    return patched


def admit_create(
    store: Store,
    resource: str,
    obj: Obj,
    *,
    namespace: str,
    user: Mapping[str, Any] | None,
    dry_run: bool,
) -> Obj:
    """Return the object after every matching webhook has mutated it; raise to reject."""
    return admit(store, resource, obj, namespace=namespace, user=user, dry_run=dry_run)


def wants(store: Store, resource: str, operation: str, subresource: str | None = None) -> bool:
    """Whether any webhook's rules cover the operation (cheap: no selectors, no calls)."""
    if store.count("mutatingwebhookconfigurations") == 0:
        return False
    rtype = resources.get(resource)
    return any(_rule_matches(r, rtype, operation, rtype.namespaced, subresource)
               for h in _webhooks(store) for r in h.get("rules") or [] if isinstance(r, dict))


def admit(store: Store, resource: str, obj: Obj | None, *, namespace: str,
          user: Mapping[str, Any] | None, dry_run: bool, operation: str = "CREATE",
          old: Obj | None = None, subresource: str | None = None, kind: str = MUTATING,
          name: str = "") -> Obj:
    """Run the matching webhooks of ``kind`` (mutating or validating configurations) on a
    request; the (mutated) object; raise to reject.

    For DELETE ``obj`` is None and the webhooks see ``old`` (they can only deny). A
    validating webhook's answer never changes the object."""
    current: Obj = obj if obj is not None else {}
    if store.count(kind) == 0:
        return current
    rtype = resources.get(resource)
    seen = obj if obj is not None else (old or {})
    hooks = [h for h in _webhooks(store, kind)
             if _matches(store, h, rtype, seen, namespace, operation, subresource)]
    if not hooks:
        return current
    who = dict(user) if user else dict(ANONYMOUS)
    kw: dict[str, Any] = {"namespace": namespace, "user": who, "dry_run": dry_run, "operation": operation,
                          "old": old, "subresource": subresource, "name": name, "mutating": kind == MUTATING}
    last_change = -1
    for index, hook in enumerate(hooks):
        before = current
        current = _run(hook, rtype, obj if obj is None else current, **kw)
        if current != before:
            last_change = index
    if last_change > 0 and obj is not None:
        # reinvocationPolicy IfNeeded: once more for earlier webhooks that may want to see
        # what later ones added (kube-apiserver reinvokes at most once).
        for hook in hooks[:last_change]:
            if hook.get("reinvocationPolicy") == "IfNeeded" and _matches(
                store, hook, rtype, current, namespace, operation, subresource
            ):
                current = _run(hook, rtype, current, **kw)
    return current


def _run(hook: Mapping[str, Any], rtype: resources.ResourceType, obj: Obj | None, *,
         namespace: str, user: Mapping[str, Any], dry_run: bool, operation: str = "CREATE",
         old: Obj | None = None, subresource: str | None = None, name: str = "",
         mutating: bool = True) -> Obj:
    """Call one webhook; the object as it answered (a mutating webhook's patch applied)."""
    hook_name = str(hook.get("name", ""))
    fail_open = hook.get("failurePolicy", "Fail") == "Ignore"
    if dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
        raise errors.BadRequest(
            f'admission webhook "{hook_name}" does not support dry run'
        )
    body = review(rtype, obj, namespace=namespace, user=user, dry_run=dry_run,
                  operation=operation, old=old, subresource=subresource, name=name)
    unchanged: Obj = obj if obj is not None else {}
    try:
        if not _conditions_match(hook, body["request"]):
            return unchanged
        try:
            response = call(hook, body)
        except CallError as exc:
            CALLS.count(hook_name, failed=exc)
            raise
        CALLS.count(hook_name)
        if not response.get("allowed"):
            raise _denial(hook_name, response)
        return _apply(unchanged, response) if obj is not None and mutating else unchanged
    except CallError as exc:
        if fail_open:
            # (in the message too, as kube-apiserver logs it: "Failed calling webhook, failing open
            # <name>: <error>"; a plain log format drops the extra fields)
            log.warning("webhook call failed, ignored (failurePolicy Ignore): %s: %s", hook_name, exc,
                        extra={"webhook": hook_name, "error": str(exc)})
            return unchanged
        raise errors.internal_error(f'failed calling webhook "{hook_name}": {exc}') from exc


def _denial(hook_name: str, response: Mapping[str, Any]) -> errors.StatusError:
    """The error the caller gets for a denial: the answer's status code (429 included),
    message or reason, and ``retryAfterSeconds``."""
    status = response.get("status") or {}
    code = int(status.get("code") or 400)
    denied = f'admission webhook "{hook_name}" denied the request'
    if status.get("message"):
        denied += f": {status['message']}"
    elif status.get("reason"):
        denied += f": {status['reason']}"
    else:
        denied += " without explanation"
    # webhook/errors/statuserror.go ToStatusErr: the webhook's Status as it is, message prefixed
    refusal = errors.StatusError(denied)
    refusal.code = code if 400 <= code < 600 else 400
    refusal.reason = str(status.get("reason") or "")
    details = status.get("details")
    if isinstance(details, dict):
        refusal.details.update(details)
        refusal.with_details = True
    retry = refusal.details.get("retryAfterSeconds")
    if not (isinstance(retry, int) and retry > 0):
        refusal.details.pop("retryAfterSeconds", None)
    return refusal


# -- validating admission of pods/eviction ------------------------------------------------
#
# kube-apiserver's eviction REST handler (pkg/registry/core/pod/storage/eviction.go) runs
# the validating webhooks (createValidation) on the Eviction before it reads the pod and
# checks the budgets. A webhook's rule names the subresource: "pods/eviction", "pods/*",
# "*/eviction" or "*/*". The review's kind is policy/v1 Eviction, its resource v1 pods,
# its subResource "eviction", its name the pod's; a denial's status code (429 included)
# is what the caller gets.


def validate_eviction(store: Store, namespace: str, name: str, eviction: Obj, *,
                      user: Mapping[str, Any] | None, dry_run: bool) -> None:
    """Call the ValidatingWebhookConfigurations that cover ``pods/eviction``; raise to reject."""
    eviction = {**eviction, "apiVersion": "policy/v1", "kind": "Eviction"}
    eviction["metadata"] = {**(eviction.get("metadata") or {}), "name": name, "namespace": namespace}
    admit(store, "pods", eviction, namespace=namespace, user=user, dry_run=dry_run,
          subresource="eviction", kind=VALIDATING, name=name)
