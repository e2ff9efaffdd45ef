"""The shipped webhook configurations, pointed at a URL: for local servers.

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
def _manifests() -> dict[str, dict[str, Any]]:
    """The manifest's objects by kind (the pod-create webhook, the eviction guard)."""
    if not MANIFEST.is_file():
        raise FileNotFoundError(f"{MANIFEST} not found: run from a checkout of the spotguard repository")
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if isinstance(doc, dict)}


def _manifest() -> dict[str, Any]:
    return _manifests()["MutatingWebhookConfiguration"]


def webhook_configuration(url: str, ca_bundle: str, **overrides: Any) -> dict[str, Any]:
    """The shipped configuration with every webhook calling ``url``, trusting ``ca_bundle`` (base64 PEM).

    ``overrides`` replace fields of every webhook (e.g. ``timeoutSeconds=5`` on a loaded test machine).
    """
    manifest = copy.deepcopy(_manifest())
    for hook in manifest["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        hook.update(overrides)
    return manifest


def eviction_webhook_configuration(url: str, ca_bundle: str, **overrides: Any) -> dict[str, Any]:
    """The shipped eviction guard (a ValidatingWebhookConfiguration for ``pods/eviction``)
    calling ``url`` (the same server; its ``/evictions`` path), trusting ``ca_bundle``."""
    manifest = copy.deepcopy(_manifests()["ValidatingWebhookConfiguration"])
    for hook in manifest["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        hook.update(overrides)
    return manifest
