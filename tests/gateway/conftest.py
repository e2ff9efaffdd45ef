"""Fixtures: a scripted API server (``api``) and a gateway pointed at it (``k``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from spotguard.gateway import kube

from tests.gateway.fakeapi import FAST, FakeApi, api_client


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeApi()
    yield server
    server.close()


@pytest.fixture
def k(api: FakeApi) -> kube.Kube:
    return kube.Kube(api_client(api.url), policy=FAST)
