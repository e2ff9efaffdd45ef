"""The official client's e2e files at the pinned version's tag, unmodified, against
`spotguard sim serve` (issue 26: "the official client's e2e files at the tag of the pinned
client version, all of them, pass except exec and port-forward").

``tests/sim/kubernetes_client_e2e/`` holds them, vendored from kubernetes-client/python
``v36.0.3`` (the wheel ships none of them); ``tests/sim/upstream_client_e2e.py`` runs them
in a pytest subprocess against a simulated cluster started as a user starts it and records
the outcome this test asserts exactly: every test passes but those deselected by exact
name (exec, port-forward, server-side apply; each with its reason there) and the metrics
test's own skip (no metrics-server, as on upstream's kind cluster).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes

from tests.sim import upstream_client_e2e as upstream


def test_the_pinned_client_is_the_tag_vendored() -> None:
    assert kubernetes.__version__ == upstream.TAG.removeprefix("v"), (
        f"the pinned client is {kubernetes.__version__}: vendor its tag's e2e files "
        "(python -m tests.sim.upstream_client_e2e CHECKOUT names the drift) and record the outcome")


def test_the_vendored_files_are_the_tags_unmodified() -> None:
    assert upstream.drift(upstream.VENDORED) == []


def test_the_official_clients_e2e_files_pass_against_the_simulated_cluster(tmp_path: Path) -> None:
    outcome = upstream.run(upstream.VENDORED, tmp_path)
    assert outcome.results, outcome.report
    assert upstream.problems(outcome) == [], outcome.report
