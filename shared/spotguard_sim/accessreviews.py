"""Access reviews and token requests: POSTed, answered, never stored.

- ``authorization.k8s.io/v1`` SelfSubjectAccessReview (``kubectl auth can-i``),
  SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectRulesReview
  (``kubectl auth can-i --list``): ``pkg/registry/authorization/*/rest.go``;
- ``authentication.k8s.io/v1`` SelfSubjectReview (``kubectl auth whoami``);
- ``serviceaccounts/<name>/token`` TokenRequest (``kubectl create token``):
  ``pkg/registry/core/serviceaccount/storage/token.go``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotguard_sim import authn, errors, rbac, wire

if TYPE_CHECKING:
    from spotguard_sim.routes import Api
    from spotguard_sim.wire import Request, Target

Obj = dict[str, Any]


def handle(api: Api, request: Request, t: Target) -> wire.Response:
    if request.method != "POST" or (t.name is not None and t.subresource is None):
        raise errors.generic_method_not_allowed()
    body = wire.load(request.body)
    if not isinstance(body, dict):
        raise errors.BadRequest(f"a {t.rtype.kind if t.subresource is None else 'TokenRequest'} must be a JSON object")
    if t.subresource == "token":
        return _token(api, t, body)
    plural = t.rtype.plural
    out: Obj = {"kind": t.rtype.kind, "apiVersion": t.rtype.api_version,
                "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})}}
    spec = body.get("spec") or {}
    if plural == "selfsubjectreviews":
        out["status"] = {"userInfo": dict(request.user)}
        return wire.json_response(201, out)
    if plural == "selfsubjectrulesreviews":
        namespace = str(spec.get("namespace") or "")
        if not namespace:
            raise errors.BadRequest("no namespace on request")
        rules, failures = api.authorizer.rules_for(request.user, namespace)
        status: Obj = {
            "resourceRules": [_pick(r, "verbs", "apiGroups", "resources", "resourceNames") for r in rules
                              if r.get("resources")],
            "nonResourceRules": [_pick(r, "verbs", "nonResourceURLs") for r in rules if r.get("nonResourceURLs")],
            "incomplete": False,
        }
        if failures:
            status["evaluationError"] = ", ".join(failures)
        out.update(spec=spec, status=status)
        return wire.json_response(201, out)
    user = request.user
    if plural in ("subjectaccessreviews", "localsubjectaccessreviews"):
        if not spec.get("user") and not spec.get("groups"):
            raise errors.invalid(t.rtype.kind, "", [{"field": "spec.user", "message":
                                 "Invalid value: \"\": at least one of user or group must be specified"}],
                                 "authorization.k8s.io")
        user = {"username": spec.get("user") or "", "uid": spec.get("uid") or "",
                "groups": list(spec.get("groups") or []), "extra": spec.get("extra") or {}}
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (resource is None) == (non_resource is None):
        raise errors.invalid(t.rtype.kind, "", [{"field": "spec.resourceAttributes", "message":
                             "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes "
                             "must be specified"}], "authorization.k8s.io")
    if plural == "localsubjectaccessreviews" and (resource is None or (resource.get("namespace") or "") != t.namespace):
        raise errors.BadRequest(f"spec.resourceAttributes.namespace must match namespace: {t.namespace}")
    if resource is not None:
        attrs = rbac.Attributes(
            user=user, verb=str(resource.get("verb") or ""), resource_request=True,
            namespace=str(resource.get("namespace") or ""), group=str(resource.get("group") or ""),
            version=str(resource.get("version") or ""), resource=str(resource.get("resource") or ""),
            subresource=str(resource.get("subresource") or ""), name=str(resource.get("name") or ""))
    else:
        assert non_resource is not None
        attrs = rbac.Attributes(user=user, verb=str(non_resource.get("verb") or ""), resource_request=False,
                                path=str(non_resource.get("path") or ""))
    decision = api.authorizer.authorize(attrs)
    answer: Obj = {"allowed": decision.allowed}
    if decision.reason:
        answer["reason"] = decision.reason
    out.update(spec=spec, status=answer)
    return wire.json_response(201, out)


def _pick(rule: rbac.Rule, *keys: str) -> Obj:
    return {k: list(rule[k]) for k in keys if rule.get(k)}


def _token(api: Api, t: Target, body: Obj) -> wire.Response:
    assert t.name is not None and t.namespace is not None
    spec = dict(body.get("spec") or {})
    seconds = spec.get("expirationSeconds", 3600)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < authn.MIN_TOKEN_SECONDS:
        raise errors.invalid("TokenRequest", t.name, [{"field": "spec.expirationSeconds", "message":
                             f"Invalid value: {seconds!r}: may not specify a duration less than 10 minutes"}],
                             "authentication.k8s.io")
    audiences = spec.get("audiences") or [authn.ISSUER]
    bound = spec.get("boundObjectRef")
    bound_obj = None
    if bound:
        if bound.get("kind") != "Pod":
            raise errors.BadRequest(f"cannot bind token to object of kind {bound.get('kind')!r} (only Pod is modelled)")
        pod = api.store.get("pods", str(bound.get("name") or ""), t.namespace)
        if bound.get("uid") and bound["uid"] != pod["metadata"]["uid"]:
            # serviceaccount/storage/token.go: NewConflict on the bound object's kind
            raise errors.conflict("Pod", str(pod["metadata"]["name"]), err=(
                f"the UID in the bound object reference ({bound['uid']}) does not match the UID in record. The "
                "object might have been deleted and then recreated"))
        bound_obj = {"kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", **bound_obj}
    token, expires = api.authenticator.issue(t.namespace, t.name, seconds, audiences, bound_obj)
    spec.update(audiences=audiences, expirationSeconds=seconds)
    clock = api.store.clock
    out = {
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": t.name, "namespace": t.namespace, "creationTimestamp": clock.iso()},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": clock.iso(expires)},
    }
    return wire.json_response(201, out)
