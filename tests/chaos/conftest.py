"""The chaos suite's fixtures and its two runs.

The default run (CI) takes the quick matrix; ``SPOTGUARD_CHAOS=full`` runs every
scenario under every API fault kind (see docs/chaos.md).
"""

from __future__ import annotations

import os

import pytest

from tests import gates
from tests.interruption.transport_support import aws_env, moto_server

__all__ = ["aws_env", "moto_server"]

FULL = os.environ.get("SPOTGUARD_CHAOS", "").lower() == "full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos_full: a chaos case of the full matrix only (SPOTGUARD_CHAOS=full)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gates.skip_unless(items, "chaos_full", FULL, "full chaos matrix: set SPOTGUARD_CHAOS=full")
