"""Who is asking: kube-apiserver's authenticators and impersonation, for the simulated cluster.

In order, as kube-apiserver's union authenticator
(``staging/src/k8s.io/apiserver/pkg/authentication``,
https://kubernetes.io/docs/reference/access-authn-authz/authentication/):

- a client certificate signed by the cluster's client CA: the user is its CN, its
  groups its O values (``request/x509``);
- a bearer token: the admin token of the kubeconfig the cluster writes
  (``kubernetes-admin`` in ``system:masters``, as kubeadm's ``admin.conf``); a
  service account token issued through ``serviceaccounts/<name>/token``
  (``kubectl create token``): ``system:serviceaccount:<ns>:<name>`` in
  ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``, valid until it
  expires (simulated time) and while its ServiceAccount (same uid) and bound pod
  exist (``pkg/serviceaccount/claims.go``); an EKS token (``k8s-aws-v1.``, a
  presigned STS GetCallerIdentity) whose access key the cluster maps to a user and
  groups, as an EKS access entry maps an IAM principal (STS is not called: the
  signature is not checked);
- any other token is 401 Unauthorized; no credentials at all is
  ``system:anonymous`` in ``system:unauthenticated``.

Every authenticated user also gets ``system:authenticated``. ``Impersonate-User``,
``Impersonate-Group`` and ``Impersonate-Uid`` then act as another user when the
authorizer lets the caller ``impersonate`` it
(``staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go``).
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson

from spotguard_sim import errors, rbac

if TYPE_CHECKING:
    from spotguard_sim.store import Store

ADMIN_TOKEN = "spotguard-sim-admin"
ADMIN_USER: dict[str, Any] = {
    "username": "kubernetes-admin",
    "uid": "spotguard-sim-admin",
    "groups": ["system:masters", "system:authenticated"],
}
ANONYMOUS: dict[str, Any] = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
AUTHENTICATED = "system:authenticated"
ISSUER = "https://kubernetes.default.svc.cluster.local"
EKS_PREFIX = "k8s-aws-v1."
EKS_TOKEN_SECONDS = 15 * 60  # EKS honours a token for 15 minutes after it was signed
MIN_TOKEN_SECONDS = 600  # TokenRequest: "may not specify a duration less than 10 minutes"


class Unauthorized(errors.StatusError):
    code, reason = 401, "Unauthorized"


def unauthorized() -> Unauthorized:
    return Unauthorized("Unauthorized")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def service_account_user(
    namespace: str, name: str, uid: str = "", extra: Mapping[str, list[str]] | None = None
) -> dict[str, Any]:
    user: dict[str, Any] = {
        "username": f"system:serviceaccount:{namespace}:{name}",
        "uid": uid,
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED],
    }
    if extra:
        user["extra"] = {k: list(v) for k, v in extra.items()}
    return user


class Authenticator:
    """The authenticators of one simulated cluster (its token signing key, its EKS map)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._key = secrets.token_bytes(32)
        self._kid = _b64(hashlib.sha256(self._key).digest()[:12])
        self.eks: dict[str, dict[str, Any]] = {}  # access key id -> user

    # ---- service account tokens ---------------------------------------------------

    def issue(self, namespace: str, name: str, seconds: int = 3600, audiences: Sequence[str] = (ISSUER,),
              bound: Mapping[str, Any] | None = None) -> tuple[str, float]:
        """A signed token for ServiceAccount ``namespace/name`` (404 when it does not exist)
        and its expiry (simulated epoch seconds)."""
        account = self.store.get("serviceaccounts", name, namespace)
        now = self.store.clock.now()
        claims: dict[str, Any] = {
            "aud": list(audiences), "exp": int(now + seconds), "iat": int(now), "nbf": int(now),
            "iss": ISSUER, "jti": str(uuid.uuid4()), "sub": f"system:serviceaccount:{namespace}:{name}",
            "kubernetes.io": {"namespace": namespace,
                              "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]}},
        }
        if bound:
            claims["kubernetes.io"][str(bound["kind"]).lower()] = {"name": bound["name"], "uid": bound["uid"]}
        header = _b64(orjson.dumps({"alg": "HS256", "kid": self._kid}))
        body = _b64(orjson.dumps(claims))
        signature = _b64(hmac.new(self._key, f"{header}.{body}".encode(), hashlib.sha256).digest())
        return f"{header}.{body}.{signature}", float(claims["exp"])

    def _service_account(self, token: str) -> dict[str, Any] | None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        expected = _b64(hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[2]):
            return None
        claims = orjson.loads(_unb64(parts[1]))
        if claims.get("exp", 0) < self.store.clock.now():
            return None
        private = claims.get("kubernetes.io") or {}
        namespace, account = private.get("namespace", ""), private.get("serviceaccount") or {}
        try:
            found = self.store.get("serviceaccounts", account.get("name", ""), namespace)
        except errors.NotFound:
            return None
        if found["metadata"]["uid"] != account.get("uid") or found["metadata"].get("deletionTimestamp"):
            return None
        pod = private.get("pod")
        if pod is not None:
            try:
                if self.store.get("pods", pod["name"], namespace)["metadata"]["uid"] != pod["uid"]:
                    return None
            except errors.NotFound:
                return None
        return service_account_user(namespace, account["name"], account["uid"],
                                    {"authentication.kubernetes.io/credential-id": [f"JTI={claims['jti']}"]})

    # ---- EKS tokens ---------------------------------------------------------------

    def map_aws_access_key(self, access_key_id: str, username: str, groups: Sequence[str]) -> None:
        """An EKS access entry for the principal behind ``access_key_id``."""
        self.eks[access_key_id] = {"username": username, "uid": f"aws-iam-authenticator:{access_key_id}",
                                   "groups": [*groups, AUTHENTICATED]}

    def _eks(self, token: str) -> dict[str, Any] | None:
        try:
            url = urlsplit(_unb64(token[len(EKS_PREFIX):]).decode())
        except (ValueError, UnicodeDecodeError):
            return None
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        signed = query.get("X-Amz-SignedHeaders", "").split(";")
        if query.get("Action") != "GetCallerIdentity" or "x-k8s-aws-id" not in signed:
            return None
        try:
            signed_at = calendar.timegm(time.strptime(query.get("X-Amz-Date", ""), "%Y%m%dT%H%M%SZ"))
        except ValueError:
            return None
        if time.time() - signed_at > EKS_TOKEN_SECONDS:
            return None
        user = self.eks.get(query.get("X-Amz-Credential", "").split("/")[0])
        return dict(user) if user else None

    # ---- the chain ----------------------------------------------------------------

    def authenticate(self, authorization: str | None, peer: Mapping[str, Any] | None) -> dict[str, Any]:
        """The user behind a request: its verified client certificate, else its bearer token
        (401 when the token is not valid), else anonymous."""
        if peer:
            subject = [item for rdn in peer.get("subject") or () for item in rdn]
            names = [v for k, v in subject if k == "commonName"]
            if names:
                groups = [v for k, v in subject if k == "organizationName"]
                added = [] if AUTHENTICATED in groups else [AUTHENTICATED]
                return {"username": names[0], "groups": [*groups, *added]}
        if not authorization:
            return dict(ANONYMOUS)
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized()
        if hmac.compare_digest(token, ADMIN_TOKEN):
            return dict(ADMIN_USER)
        user = self._eks(token) if token.startswith(EKS_PREFIX) else self._service_account(token)
        if user is None:
            raise unauthorized()
        return user


def impersonate(
    user: dict[str, Any], headers: Mapping[str, Sequence[str]], authorizer: rbac.Authorizer
) -> dict[str, Any]:
    """The user ``Impersonate-*`` headers ask for, each checked with the ``impersonate`` verb
    (a 403 names the first one refused)."""
    wanted = (headers.get("impersonate-user") or [""])[0]
    groups = list(headers.get("impersonate-group") or [])
    uid = (headers.get("impersonate-uid") or [""])[0]
    if not wanted:
        if groups or uid:
            raise errors.BadRequest(f"requested impersonation of groups {groups} or uid without impersonating a user")
        return user
    checks: list[rbac.Attributes] = []
    if wanted.startswith("system:serviceaccount:") and wanted.count(":") == 3:
        _, _, namespace, name = wanted.split(":")
        checks.append(rbac.Attributes(user=user, verb="impersonate", resource_request=True, namespace=namespace,
                                      resource="serviceaccounts", name=name))
        if not groups:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    else:
        checks.append(rbac.Attributes(user=user, verb="impersonate", resource_request=True, resource="users",
                                      name=wanted))
    checks += [rbac.Attributes(user=user, verb="impersonate", resource_request=True, resource="groups", name=g)
               for g in list(headers.get("impersonate-group") or [])]
    if uid:
        checks.append(rbac.Attributes(user=user, verb="impersonate", resource_request=True,
                                      group="authentication.k8s.io", resource="uids", name=uid))
    for attrs in checks:
        decision = authorizer.authorize(attrs)
        if not decision.allowed:
            message, details = rbac.forbidden_message(attrs, decision.reason)
            raise errors.Forbidden(message, **details)
    if wanted == ANONYMOUS["username"]:
        groups += [] if "system:unauthenticated" in groups else ["system:unauthenticated"]
    elif AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    out: dict[str, Any] = {"username": wanted, "groups": groups}
    if uid:
        out["uid"] = uid
    return out
