"""The official client's shipped e2e tests, unmodified, against `spotguard sim serve`.

The ``kubernetes`` wheel pinned in requirements.txt ships upstream's dynamic-client
e2e tests (``kubernetes/dynamic/test_client.py`` and ``test_discovery.py``, from
kubernetes-client/python) but not the ``kubernetes.e2e_test.base`` they import.
This test runs those two files straight from the installed package, in a pytest
subprocess, against a simulated cluster it starts as a user would (``spotguard sim
serve --kubeconfig``). ``upstream_e2e_base/`` provides ``kubernetes.e2e_test.base``
without shadowing the real package: the ``spotguard_e2e_base_plugin`` pytest plugin
appends that directory to ``kubernetes.__path__``, and its ``base.py`` loads
``$KUBECONFIG`` as upstream's does (failing where upstream would skip).

The files missing from the installed package is a failure, not a skip. Every test
runs except those deselected below, by exact name, each with its reason; the
outcome must be exactly ``PASSING`` (nothing failed, skipped or errored).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import kubernetes

from tests.sim import served

SHIM = Path(__file__).resolve().parent / "upstream_e2e_base"
PACKAGE = Path(kubernetes.__file__).resolve().parent
SITE = PACKAGE.parent
FILES = ("kubernetes/dynamic/test_client.py", "kubernetes/dynamic/test_discovery.py")
CLIENT = "kubernetes/dynamic/test_client.py::TestDynamicClient"
CRD_V1BETA1 = ("creates a CustomResourceDefinition through apiextensions.k8s.io/v1beta1, which "
               "Kubernetes removed in 1.22 (it fails on any current cluster), and the simulated "
               "cluster serves no CRDs (docs/sim.md)")
DESELECTED = {
    f"{CLIENT}::test_cluster_custom_resources": CRD_V1BETA1,
    f"{CLIENT}::test_namespaced_custom_resources": CRD_V1BETA1,
    f"{CLIENT}::test_async_namespaced_custom_resources": CRD_V1BETA1,
    f"{CLIENT}::test_server_side_apply_api":
        "server-side apply is not served by the simulated cluster (415 UnsupportedMediaType, "
        "docs/sim.md 'Not served')",
    "kubernetes/dynamic/test_discovery.py::TestDiscoverer::test_cache_decoder_resource_and_subresource":
        "asserts deploy1 == deploy2 for two Resources decoded by two DynamicClients, but "
        "kubernetes.dynamic.resource.Resource (36.0.3) defines no __eq__: identity, False against "
        "any cluster (upstream's e2e workflow runs kubernetes/e2e_test only, never these files)",
}
PASSING = {
    "kubernetes.dynamic.test_client.TestDynamicClient.test_service_apis",
    "kubernetes.dynamic.test_client.TestDynamicClient.test_replication_controller_apis",
    "kubernetes.dynamic.test_client.TestDynamicClient.test_configmap_apis",
    "kubernetes.dynamic.test_client.TestDynamicClient.test_node_apis",
    "kubernetes.dynamic.test_client.TestDynamicClient.test_node_apis_partial_object_metadata",
    "kubernetes.dynamic.test_client.TestDynamicClientSerialization.test_dict_type",
    "kubernetes.dynamic.test_client.TestDynamicClientSerialization.test_resource_instance_type",
    "kubernetes.dynamic.test_client.TestDynamicClientSerialization.test_resource_field",
    "kubernetes.dynamic.test_discovery.TestDiscoverer.test_init_cache_from_file",
}
__doc__ = (__doc__ or "") + "\nDeselected:\n" + "".join(
    f"\n- ``{k}``: {v}" for k, v in DESELECTED.items()) + "\n"


def outcomes(junit: Path) -> dict[str, str]:
    """``{classname.name: passed|failed|error|skipped}`` from a JUnit XML report."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[f"{case.get('classname')}.{case.get('name')}"] = {
            "failure": "failed", "error": "error", "skipped": "skipped"}.get(kinds[0] if kinds else "", "passed")
    return found


def test_the_shipped_upstream_dynamic_client_e2e_tests_pass_unmodified(tmp_path: Path) -> None:
    for name in FILES:
        assert (SITE / name).is_file(), (
            f"{name} is not in the installed kubernetes package ({PACKAGE}): the pinned wheel no "
            "longer ships upstream's dynamic-client e2e tests")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repository's settings
    junit = tmp_path / "junit.xml"
    with served.serving(tmp_path) as kubeconfig:
        args = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(SITE),
                "-p", "no:cacheprovider", "-p", "spotguard_e2e_base_plugin", "-q", "-rfEs",
                f"--junitxml={junit}", *(str(SITE / name) for name in FILES)]
        for test_id in DESELECTED:  # node ids relative to site-packages (the rootdir)
            args += ["--deselect", test_id]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env |= {"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(SHIM),
               "TMPDIR": str(tmp_path),  # the dynamic client's discovery cache files, ours alone
               "PYTHONDONTWRITEBYTECODE": "1"}
        result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=240, check=False)
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert junit.is_file(), report
    got = outcomes(junit)
    assert {k: v for k, v in got.items() if v != "passed"} == {}, report
    assert set(got) == PASSING, report
    left_out = re.search(r"(\d+) deselected", result.stdout)
    assert left_out is not None and int(left_out.group(1)) == len(DESELECTED), report
    assert result.returncode == 0, report
