"""GIVEN AWS credentials and $SPOTGUARD_EKS_CLUSTER, THEN the gateway sends the token EKS expects.

The format is that of ``aws eks get-token`` / aws-iam-authenticator: ``k8s-aws-v1.`` and the
unpadded base64url of a presigned STS GetCallerIdentity GET URL, valid 60 s, whose signed
headers include ``x-k8s-aws-id`` (the cluster name).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from spotguard import certs
from spotguard.gateway import eks, kube
from spotguard.gateway import resources as r
from spotguard.logs import UserError

from tests.gateway.fakeapi import Answer, FakeApi

REGION = "eu-west-1"


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fixed fake credentials, no kubeconfig and no in-cluster environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)


def decode(token: str) -> str:
    assert token.startswith(eks.TOKEN_PREFIX)
    body = token[len(eks.TOKEN_PREFIX) :]
    assert "=" not in body  # padding stripped, as aws eks get-token does
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def sts() -> object:
    return eks.sts_client(boto3.session.Session(region_name=REGION))


def test_token_is_a_presigned_get_caller_identity() -> None:
    url = urlsplit(decode(eks.token("prod-cluster", sts())))
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert url.scheme == "https"
    assert url.hostname in (f"sts.{REGION}.amazonaws.com", "sts.amazonaws.com")
    assert query["Action"] == "GetCallerIdentity"
    assert query["Version"] == "2011-06-15"
    assert query["X-Amz-Expires"] == "60"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Credential"].startswith("AKIAIOSFODNN7EXAMPLE/")
    assert query["X-Amz-Credential"].endswith(f"/{REGION}/sts/aws4_request")
    assert query["X-Amz-SignedHeaders"].split(";") == ["host", "x-k8s-aws-id"]
    assert len(query["X-Amz-Signature"]) == 64
    assert "x-k8s-aws-id" not in query  # a signed header, not a query parameter


def test_the_cluster_name_is_signed() -> None:
    client = sts()
    one = parse_qs(urlsplit(decode(eks.token("cluster-a", client))).query)
    two = parse_qs(urlsplit(decode(eks.token("cluster-b", client))).query)
    if one["X-Amz-Date"] == two["X-Amz-Date"]:
        assert one["X-Amz-Signature"] != two["X-Amz-Signature"]


def test_the_token_is_signed_again_before_it_expires() -> None:
    source = eks.TokenSource("c", sts(), refresh_seconds=0.5)
    first = source.get()
    assert source.get() is first  # cached while fresh
    time.sleep(1.05)  # X-Amz-Date has a one-second resolution
    second = source.get()
    assert second != first
    assert (
        parse_qs(urlsplit(decode(second)).query)["X-Amz-Date"] != parse_qs(urlsplit(decode(first)).query)["X-Amz-Date"]
    )


def test_connect_sends_the_token_to_the_endpoint_over_verified_tls(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served = certs.make(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    server = FakeApi(tls=(served.cert, served.key))
    try:
        server.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
        monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "prod-cluster")
        monkeypatch.setenv("SPOTGUARD_EKS_ENDPOINT", server.url)
        monkeypatch.setenv("SPOTGUARD_EKS_CA", served.ca_bundle)
        k = kube.connect()
        assert k.get(r.NODES, "n")["kind"] == "Node"
        auth = server.requests[-1].headers["authorization"]
        assert auth.startswith("Bearer k8s-aws-v1.")
        assert "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id" in decode(auth.removeprefix("Bearer "))
    finally:
        server.close()


def test_a_bad_ca_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "c")
    monkeypatch.setenv("SPOTGUARD_EKS_ENDPOINT", "https://127.0.0.1:1")
    monkeypatch.setenv("SPOTGUARD_EKS_CA", "%%% not base64 %%%")
    with pytest.raises(UserError, match="base64"):
        kube.connect()
    monkeypatch.setenv("SPOTGUARD_EKS_CA", base64.b64encode(b"hello").decode())
    with pytest.raises(UserError, match="PEM"):
        kube.connect()


def test_a_region_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "c")
    with pytest.raises(UserError, match="AWS_REGION"):
        kube.connect()


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_eks(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    return moto_server


def test_endpoint_from_describe_cluster(moto_eks: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made = boto3.client("eks", region_name=REGION).create_cluster(
        name="prod-cluster",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )["cluster"]
    served = certs.make(tmp_path / "tls", ["localhost"])
    monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "prod-cluster")
    monkeypatch.setenv("SPOTGUARD_EKS_CA", served.ca_bundle)
    conf = eks.configuration()
    assert conf.host == made["endpoint"].rstrip("/")
    assert Path(conf.ssl_ca_cert).read_bytes() == served.ca_cert.read_bytes()
    assert conf.api_key["BearerToken"].startswith("Bearer " + eks.TOKEN_PREFIX)


def test_an_unknown_cluster_is_a_user_error(moto_eks: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "no-such-cluster")
    with pytest.raises(UserError, match="DescribeCluster"):
        kube.connect()


def test_a_described_ca_that_is_not_pem_is_a_user_error(moto_eks: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # moto answers DescribeCluster with random characters as certificateAuthority.data
    boto3.client("eks", region_name=REGION).create_cluster(
        name="odd-ca",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )
    monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "odd-ca")
    with pytest.raises(UserError, match="DescribeCluster returned"):
        kube.connect()
