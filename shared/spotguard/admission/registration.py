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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

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


class Store(Protocol):
    """Where the configurations go: the simulated cluster's store (create, or replace)."""

    def apply_objects(self, objects: list[dict[str, Any]]) -> Sequence[dict[str, Any]]: ...


def shipped(base_url: str, ca_bundle: str, *, pods: bool = True, evictions: bool = True, **overrides: Any) -> list[
    dict[str, Any]
]:
    """Every shipped webhook configuration, served by the one server at ``base_url``: the
    pod-create webhook on ``/mutate`` and the eviction guard on ``/evictions``."""
    base = base_url.rstrip("/")
    out = []
    if pods:
        out.append(webhook_configuration(f"{base}/mutate", ca_bundle, **overrides))
    if evictions:
        out.append(eviction_webhook_configuration(f"{base}/evictions", ca_bundle, **overrides))
    return out


def register(
    store: Store, base_url: str, ca_bundle: str, *, pods: bool = True, evictions: bool = True, **overrides: Any
) -> None:
    """Register everything as shipped (:func:`shipped`) in ``store``, replacing what is there."""
    store.apply_objects(shipped(base_url, ca_bundle, pods=pods, evictions=evictions, **overrides))
