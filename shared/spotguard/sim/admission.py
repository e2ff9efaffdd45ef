"""Mutating admission: call MutatingWebhookConfigurations on CREATE, as kube-apiserver does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotguard.sim.store import Store


def admit_create(
    store: Store,
    resource: str,
    obj: dict[str, Any],
    *,
    namespace: str,
    user: Mapping[str, Any] | None,
    dry_run: bool,
) -> dict[str, Any]:
    """Return the object after every matching webhook has mutated it (stub: no webhooks)."""
    return obj
