"""Suite-wide settings: the slow end-to-end cases behind ``SPOTGUARD_E2E=full``.

CI runs the default set. A case marked ``e2e_full`` repeats, at length, what a quicker
test of the default set already proves (each mark says which); ``SPOTGUARD_E2E=full``
runs them too (docs/testing in the README).
"""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("SPOTGUARD_E2E", "").lower() == "full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e_full: a slow end-to-end case run only with SPOTGUARD_E2E=full (what it repeats is proven quicker)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    skip = pytest.mark.skip(reason="slow end-to-end repeat: set SPOTGUARD_E2E=full")
    for item in items:
        if "e2e_full" in item.keywords:
            item.add_marker(skip)
