"""GIVEN a kubeconfig, an in-cluster environment or nothing, THEN connect finds the cluster or says what to set."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from spotguard import certs
from spotguard.gateway import connection, kube
from spotguard.gateway import resources as r
from spotguard.logs import UserError

from tests.gateway.fakeapi import Answer, FakeApi


def write_kubeconfig(path: Path, server: str, token: str, context: str = "fake") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": context, "cluster": {"server": server}}],
                "users": [{"name": context, "user": {"token": token}}],
                "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
                "current-context": context,
            }
        )
    )
    return path


def test_an_explicit_kubeconfig_with_a_token(api: FakeApi, tmp_path: Path) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    path = write_kubeconfig(tmp_path / "config", api.url, "secret-token")
    k = kube.connect(str(path))
    assert k.get(r.NODES, "n")["kind"] == "Node"
    assert api.requests[-1].headers["authorization"] == "Bearer secret-token"


def test_kubeconfig_from_the_environment_then_home(api: FakeApi, tmp_path: Path) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    from_env = write_kubeconfig(tmp_path / "env-config", api.url, "from-env")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    write_kubeconfig(home / ".kube" / "config", api.url, "from-home")

    k = kube.Kube(connection.api_client(None, env={"KUBECONFIG": str(from_env), "HOME": str(home)}))
    k.get(r.NODES, "n")
    assert api.requests[-1].headers["authorization"] == "Bearer from-env"

    k = kube.Kube(connection.api_client(None, env={"HOME": str(home)}))
    k.get(r.NODES, "n")
    assert api.requests[-1].headers["authorization"] == "Bearer from-home"


def test_a_context_other_than_the_current_one(api: FakeApi, tmp_path: Path) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    path = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1", "wrong")
    data = yaml.safe_load(path.read_text())
    data["clusters"].append({"name": "other", "cluster": {"server": api.url}})
    data["users"].append({"name": "other", "user": {"token": "right"}})
    data["contexts"].append({"name": "other", "context": {"cluster": "other", "user": "other"}})
    path.write_text(yaml.safe_dump(data))
    client = connection.api_client(str(path), env={"SPOTGUARD_KUBE_CONTEXT": "other"})
    kube.Kube(client).get(r.NODES, "n")
    assert api.requests[-1].headers["authorization"] == "Bearer right"


def test_the_client_is_tuned_for_concurrency_and_leaves_retries_to_the_gateway(tmp_path: Path) -> None:
    client = connection.api_client(str(write_kubeconfig(tmp_path / "c", "http://127.0.0.1:1", "t")))
    assert client.configuration.connection_pool_maxsize == 32
    pool_kw = client.rest_client.pool_manager.connection_pool_kw
    assert pool_kw["maxsize"] == 32
    assert getattr(pool_kw["retries"], "total", pool_kw["retries"]) is False


def test_nothing_configured_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="KUBECONFIG") as caught:
        connection.api_client(None, env={"HOME": str(tmp_path)})
    assert "SPOTGUARD_EKS_CLUSTER" in str(caught.value)


def test_a_missing_or_broken_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        connection.api_client(str(tmp_path / "nope"))
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(UserError, match="cannot use kubeconfig"):
        connection.api_client(str(broken))


def test_in_cluster_uses_the_service_account_over_verified_tls(tmp_path: Path) -> None:
    served = certs.make(tmp_path / "tls", ["kubernetes.default.svc"], ["127.0.0.1"])
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token")
    (account / "ca.crt").write_bytes(served.ca_cert.read_bytes())
    server = FakeApi(tls=(served.cert, served.key))
    try:
        server.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
        port = server.url.rsplit(":", 1)[1]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port, "HOME": str(tmp_path)}
        # in-cluster wins over a kubeconfig in the home directory
        (tmp_path / ".kube").mkdir()
        write_kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:1", "wrong")
        k = kube.Kube(connection.api_client(None, env=env, service_account_dir=str(account)))
        assert k.get(r.NODES, "n")["kind"] == "Node"
        assert server.requests[-1].headers["authorization"].lower() == "bearer pod-token"
    finally:
        server.close()


def test_in_cluster_without_a_service_account_is_a_clear_error(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1", "HOME": str(tmp_path)}
    with pytest.raises(UserError, match="in-cluster"):
        connection.api_client(None, env=env, service_account_dir=str(tmp_path / "none"))
