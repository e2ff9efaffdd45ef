"""Write a kubeconfig for the simulated cluster (kubectl and the kubernetes client accept it)."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

import yaml

CONTEXT = "spotguard-sim"


def render(server_url: str, token: str | None, ca_pem: bytes | None,
           client_cert: tuple[bytes, bytes] | None = None) -> str:
    """A kubeconfig whose user is ``token`` or ``client_cert`` (certificate, key PEM)."""
    cluster: dict[str, object] = {"server": server_url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    user: dict[str, str] = {}
    if token is not None:
        user["token"] = token
    if client_cert is not None:
        user["client-certificate-data"] = base64.b64encode(client_cert[0]).decode()
        user["client-key-data"] = base64.b64encode(client_cert[1]).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        "users": [{"name": CONTEXT, "user": user}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT,
                                                   "namespace": "default"}}],
        "current-context": CONTEXT,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write(path: str | os.PathLike[str], server_url: str, token: str | None,
          ca_pem: bytes | None, client_cert: tuple[bytes, bytes] | None = None) -> Path:
    """Write atomically (a reader never sees half a file), mode 0600."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".kubeconfig-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(render(server_url, token, ca_pem, client_cert))
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target
