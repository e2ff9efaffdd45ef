"""hypothesis-driven fuzzing of every entry point in :data:`tests.fuzz.entrypoints.ENTRY_POINTS`.

Each entry point runs as shipped (the gunicorn and hypercorn servers as
processes, the Knative functions under func-python's ASGI applications, the
Lambda handlers called with Lambda's event shapes) against the simulated
cluster. ``SPOTGUARD_FUZZ_EXAMPLES`` sets the number of inputs per entry point
(default 200, what CI runs); the dedicated run in docs/evidence.md uses 10000:

    SPOTGUARD_FUZZ_EXAMPLES=10000 .venv/bin/pytest -p no:cacheprovider tests/fuzz -n 0
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spotguard_sim import objects, testing

from tests.fuzz import entrypoints

EXAMPLES = int(os.environ.get("SPOTGUARD_FUZZ_EXAMPLES") or 200)
BY_NAME = {e.name: e for e in entrypoints.ENTRY_POINTS}

# The instances of the AWS samples in tests/events, so mutated notices reach real nodes.
SPOT_INSTANCES = {"spot-a": "i-1234567890abcdef0", "spot-b": "i-0b662ef9931388ba0"}


def scenario() -> list[dict[str, Any]]:
    nodes = [
        objects.node(
            name, "spot", zone="us-east-2a", cpu="8", memory="32Gi", provider=objects.provider_id("us-east-2a", i)
        )
        for name, i in SPOT_INSTANCES.items()
    ]
    nodes.append(
        objects.node("od-a", "on-demand", zone="us-east-2a", cpu="8", memory="32Gi",
                     provider=objects.provider_id("us-east-2a", "i-0aaaaaaaaaaaaaaa1"))
    )  # fmt: skip
    template = objects.pod_template("web", containers=[objects.container("web", cpu="100m")])
    return [objects.namespace("shop"), *nodes, objects.deployment("web", 3, namespace="shop", template=template)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[entrypoints.Cluster]:
    with testing.running_cluster(scenario()) as sim:
        yield entrypoints.Cluster(sim.kubeconfig, Path(tmp_path_factory.mktemp("fuzz")))


@pytest.fixture(scope="module", params=sorted(BY_NAME))
def entry(request: pytest.FixtureRequest, cluster: entrypoints.Cluster) -> Iterator[tuple[str, entrypoints.Send]]:
    entry_point = BY_NAME[request.param]
    with entry_point.start(cluster) as send:
        yield entry_point.name, send


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_no_input_crashes_denies_or_gets_a_5xx(entry: tuple[str, entrypoints.Send], data: st.DataObject) -> None:
    name, send = entry
    entry_point = BY_NAME[name]
    sent = data.draw(entry_point.inputs(), label="input")
    answer = send(sent)
    entry_point.check(sent, answer)
