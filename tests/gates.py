"""Slow runs behind a setting: a marker's tests are skipped unless their setting is on."""

from __future__ import annotations

import pytest


def skip_unless(items: list[pytest.Item], marker: str, on: bool, reason: str) -> None:
    """Skip every collected test carrying ``marker`` unless ``on``, with ``reason``."""
    if on:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)
