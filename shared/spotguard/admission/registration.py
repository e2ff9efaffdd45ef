"""The shipped MutatingWebhookConfiguration, pointed at a URL: for local servers.

``infra/kubernetes/base/webhook.yaml`` is the one definition of how the API
server calls the admission function (rules, selectors, failurePolicy Ignore,
timeout, sideEffects, reinvocation). The demo, the benchmarks and the end-to-end
tests register that same object with ``clientConfig.url`` and the local CA
instead of the in-cluster Service, so what they exercise is what users deploy.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

MANIFEST = Path(__file__).resolve().parents[3] / "infra" / "kubernetes" / "base" / "webhook.yaml"


@functools.cache
def _manifest() -> dict[str, Any]:
    if not MANIFEST.is_file():
        raise FileNotFoundError(f"{MANIFEST} not found: run from a checkout of the spotguard repository")
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


def webhook_configuration(url: str, ca_bundle: str, **overrides: Any) -> dict[str, Any]:
    """The shipped configuration with every webhook calling ``url``, trusting ``ca_bundle`` (base64 PEM).

    ``overrides`` replace fields of every webhook (e.g. ``timeoutSeconds=5`` on a loaded test machine).
    """
    manifest = copy.deepcopy(_manifest())
    for hook in manifest["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        hook.update(overrides)
    return manifest
