"""Suite-wide settings: the slow end-to-end cases behind ``SPOTGUARD_E2E=full``.

CI runs the default set. A case marked ``e2e_full`` repeats, at length, what a quicker
test of the default set already proves (each mark says which); ``SPOTGUARD_E2E=full``
runs them too (docs/testing in the README).
"""

from __future__ import annotations

import os

import pytest

from tests import gates

FULL = os.environ.get("SPOTGUARD_E2E", "").lower() == "full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e_full: a slow end-to-end case run only with SPOTGUARD_E2E=full (what it repeats is proven quicker)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gates.skip_unless(items, "e2e_full", FULL, "slow end-to-end repeat: set SPOTGUARD_E2E=full")
