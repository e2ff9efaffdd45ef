"""Reach an EKS cluster's API from a Lambda: a bearer token from a presigned STS URL.

The token is what ``aws eks get-token`` and aws-iam-authenticator produce:
``k8s-aws-v1.`` followed by the unpadded base64url of a presigned GET
``https://sts.<region>.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15...``
whose signature covers the header ``x-k8s-aws-id: <cluster name>`` and whose
``X-Amz-Expires`` is 60. EKS accepts a token for 15 minutes after it was
signed; spotguard signs a new one every :data:`REFRESH_SECONDS`.

Settings (environment):

* ``SPOTGUARD_EKS_CLUSTER``: the cluster name (required);
* ``SPOTGUARD_EKS_ENDPOINT``: the API server URL (``https://XXXX.gr7.<region>.eks.amazonaws.com``);
* ``SPOTGUARD_EKS_CA``: the cluster CA, base64 PEM (``certificateAuthority.data``);
* without the two above, they come from ``eks:DescribeCluster``;
* ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and the usual AWS credentials chain.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import boto3
import botocore.exceptions
from kubernetes import client

from spotguard.logs import UserError

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_HEADER = "x-k8s-aws-id"
URL_EXPIRES_SECONDS = 60
REFRESH_SECONDS = 10 * 60  # EKS honours a token for 15 minutes after signing


def _session(env: Mapping[str, str]) -> boto3.session.Session:
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise UserError("SPOTGUARD_EKS_CLUSTER is set but AWS_REGION is not")
    return boto3.session.Session(region_name=region)


def sts_client(session: boto3.session.Session) -> Any:
    """An STS client that carries ``x-k8s-aws-id`` from the call's params into the signed headers."""
    sts = session.client("sts")

    def take_cluster(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if CLUSTER_HEADER in params:
            context[CLUSTER_HEADER] = params.pop(CLUSTER_HEADER)

    def add_header(request: Any, **_: Any) -> None:
        if CLUSTER_HEADER in request.context:
            request.headers[CLUSTER_HEADER] = request.context[CLUSTER_HEADER]

    sts.meta.events.register("provide-client-params.sts.GetCallerIdentity", take_cluster)
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_header)
    return sts


def token(cluster: str, sts: Any) -> str:
    """A fresh ``k8s-aws-v1.`` bearer token for ``cluster``."""
    url = sts.generate_presigned_url(
        "get_caller_identity",
        Params={CLUSTER_HEADER: cluster},
        ExpiresIn=URL_EXPIRES_SECONDS,
        HttpMethod="GET",
    )
    encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return TOKEN_PREFIX + encoded


class TokenSource:
    """Signs a token on first use and again once it is :data:`REFRESH_SECONDS` old. Thread-safe."""

    def __init__(self, cluster: str, sts: Any, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.cluster = cluster
        self._sts = sts
        self._refresh = refresh_seconds
        self._lock = threading.Lock()
        self._token = ""
        self._signed_at = 0.0

    def get(self) -> str:
        with self._lock:
            if not self._token or time.monotonic() - self._signed_at >= self._refresh:
                self._token = token(self.cluster, self._sts)
                self._signed_at = time.monotonic()
            return self._token

    def hook(self, configuration: client.Configuration) -> None:
        """A ``refresh_api_key_hook``: the client calls it before each request."""
        # kubernetes >= 36 reads "BearerToken", older clients "authorization"; neither gets a
        # prefix added, so the value carries "Bearer ".
        value = f"Bearer {self.get()}"
        configuration.api_key["BearerToken"] = value
        configuration.api_key["authorization"] = value


def configuration(env: Mapping[str, str] | None = None) -> client.Configuration:
    """A client Configuration for the EKS cluster named by ``$SPOTGUARD_EKS_CLUSTER``."""
    env = os.environ if env is None else env
    cluster = env.get("SPOTGUARD_EKS_CLUSTER", "").strip()
    if not cluster:
        raise UserError("SPOTGUARD_EKS_CLUSTER is not set")
    endpoint = env.get("SPOTGUARD_EKS_ENDPOINT", "").strip()
    ca_b64 = env.get("SPOTGUARD_EKS_CA", "").strip()
    ca_pem = _pem(ca_b64, "SPOTGUARD_EKS_CA") if ca_b64 else b""
    session = _session(env)
    if not endpoint or not ca_pem:
        found_endpoint, found_ca = describe_cluster(session, cluster)
        endpoint = endpoint or found_endpoint
        ca_pem = ca_pem or _pem(found_ca, f"the CA DescribeCluster returned for {cluster!r}")
    source = TokenSource(cluster, sts_client(session))
    conf = client.Configuration()
    conf.host = endpoint.rstrip("/")
    conf.ssl_ca_cert = _write_ca(ca_pem)
    conf.refresh_api_key_hook = source.hook
    source.hook(conf)
    return conf


def describe_cluster(session: boto3.session.Session, cluster: str) -> tuple[str, str]:
    """The endpoint and base64 CA of an EKS cluster, from DescribeCluster."""
    try:
        found = session.client("eks").describe_cluster(name=cluster)["cluster"]
    except botocore.exceptions.ClientError as exc:
        raise UserError(f"EKS DescribeCluster {cluster!r} failed: {exc}") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise UserError(
            f"cannot reach EKS to describe {cluster!r} ({exc}); set SPOTGUARD_EKS_ENDPOINT and SPOTGUARD_EKS_CA instead"
        ) from exc
    endpoint = str(found.get("endpoint") or "")
    ca = str((found.get("certificateAuthority") or {}).get("data") or "")
    if not endpoint or not ca:
        raise UserError(f"EKS cluster {cluster!r} has no endpoint or CA yet (status {found.get('status')})")
    return endpoint, ca


def _pem(ca_b64: str, what: str) -> bytes:
    try:
        pem = base64.b64decode(ca_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UserError(f"{what} is not base64 (give certificateAuthority.data as is)") from exc
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise UserError(f"{what} does not hold a PEM certificate")
    return pem


def _write_ca(pem: bytes) -> str:
    handle, path = tempfile.mkstemp(prefix="spotguard-eks-ca-", suffix=".crt")
    with os.fdopen(handle, "wb") as out:
        out.write(pem)
    return path
