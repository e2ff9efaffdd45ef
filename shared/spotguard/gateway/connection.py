"""Where the cluster is and how to authenticate: the ``ApiClient`` behind :func:`kube.connect`.

In order:

1. an explicit ``kubeconfig`` path (``connect("/path/to/kubeconfig")``);
2. in-cluster: the pod's service account, when ``KUBERNETES_SERVICE_HOST`` is set;
3. ``$KUBECONFIG`` (the first file of a ``:``-separated list), then ``~/.kube/config``;
4. EKS, when ``$SPOTGUARD_EKS_CLUSTER`` is set (a Lambda): a token from a presigned
   STS GetCallerIdentity URL, refreshed before it expires; the endpoint and CA from
   ``$SPOTGUARD_EKS_ENDPOINT`` and ``$SPOTGUARD_EKS_CA`` (base64 PEM, as
   ``certificateAuthority.data``) or from EKS DescribeCluster.

``$SPOTGUARD_KUBE_CONTEXT`` picks a kubeconfig context other than the current one.
Nothing configured is a :class:`~spotguard.logs.UserError` saying what to set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client, config
from kubernetes.config import incluster_config

from spotguard.logs import UserError

POOL_MAXSIZE = 32
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def api_client(
    kubeconfig: str | None = None,
    env: Mapping[str, str] | None = None,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
) -> client.ApiClient:
    env = os.environ if env is None else env
    if kubeconfig:
        return _from_kubeconfig(kubeconfig, env.get("SPOTGUARD_KUBE_CONTEXT") or None)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return _client(_in_cluster(env, Path(service_account_dir)))
    for candidate in _kubeconfig_candidates(env):
        if candidate.is_file():
            return _from_kubeconfig(str(candidate), env.get("SPOTGUARD_KUBE_CONTEXT") or None)
    if env.get("SPOTGUARD_EKS_CLUSTER"):
        from spotguard.gateway import eks

        return _client(eks.configuration(env))
    raise UserError(
        "no Kubernetes cluster configured: run inside a cluster, set KUBECONFIG or pass "
        "--kubeconfig, or set SPOTGUARD_EKS_CLUSTER (with SPOTGUARD_EKS_ENDPOINT and "
        "SPOTGUARD_EKS_CA, or AWS credentials allowed to call eks:DescribeCluster)"
    )


def _in_cluster(env: Mapping[str, str], account: Path) -> client.Configuration:
    """The pod's service account; the client re-reads the (rotated) token file every minute."""
    configuration = client.Configuration()
    loader = incluster_config.InClusterConfigLoader(
        token_filename=str(account / "token"),
        cert_filename=str(account / "ca.crt"),
        environ=env,
    )
    try:
        loader.load_and_set(configuration)
    except config.ConfigException as exc:
        raise UserError(f"in-cluster configuration failed ({account}): {exc}") from exc
    return configuration


def _kubeconfig_candidates(env: Mapping[str, str]) -> list[Path]:
    found = [Path(p).expanduser() for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p]
    home = env.get("HOME")
    found.append(Path(home, ".kube", "config") if home else Path("~/.kube/config").expanduser())
    return found


def _from_kubeconfig(path: str, context: str | None) -> client.ApiClient:
    if not Path(path).is_file():
        raise UserError(f"kubeconfig {path} does not exist")
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise UserError(f"cannot use kubeconfig {path}: {exc}") from exc
    return _client(configuration)


def _client(configuration: client.Configuration) -> client.ApiClient:
    configuration.connection_pool_maxsize = POOL_MAXSIZE
    configuration.retries = False  # the gateway retries (spotguard.gateway.retry)
    return client.ApiClient(configuration)
