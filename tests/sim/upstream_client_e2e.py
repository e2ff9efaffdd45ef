"""kubernetes-client/python's own e2e files, at the tag of the pinned client, unmodified,
against `spotguard sim serve`.

The ``kubernetes`` wheel pinned in requirements.txt (36.0.3) ships neither
``kubernetes/e2e_test`` nor ``kubernetes/aio/e2e_test`` (nor any sdist on PyPI), so the
files are vendored, byte for byte, from https://github.com/kubernetes-client/python at
tag ``v36.0.3`` (commit 67e7d9ab) in ``tests/sim/kubernetes_client_e2e/`` (Apache-2.0, the
licence beside them; ``MANIFEST`` below is each file's git blob id at the tag):
``kubernetes/e2e_test`` whole (``test_client``, ``test_apps``, ``test_batch``,
``test_watch``, ``test_informer``, ``test_utils`` with its ``test_yaml/`` manifests for
``create_from_yaml``, ``base``, ``port_server``), ``kubernetes/aio/e2e_test`` whole (the
asyncio client's: ``test_api``, ``test_batch``, ``test_apply_patch``, ``base``) and
``kubernetes/aio/utils`` (``__init__``, ``create_from_yaml``), which ``aio/e2e_test/test_api``
imports but the wheel leaves out. These are what upstream's e2e workflow at the tag runs
(``pytest kubernetes/e2e_test kubernetes/aio/e2e_test`` against a kind cluster).

``tests/sim/test_upstream_client_e2e.py`` runs them in CI (``run`` below) and asserts the
exact outcome: ``PASSING`` pass, ``SKIPPED`` skip with its reason, ``DESELECTED`` are
deselected by exact name, nothing else. By hand, against a checkout (or a bare clone) of
that repository, to check the vendored copy against the tag and run the tag's files:

    python -m tests.sim.upstream_client_e2e [CHECKOUT]

The files run as upstream's workflow runs them, reaching the simulated cluster through
the kubeconfig their ``base.get_e2e_configuration`` loads (``$KUBECONFIG``), from a copy
in a temporary directory (their paths are relative to it; ``aio/e2e_test/test_api``
writes ``temp.yaml`` there). ``spotguard_client_e2e_plugin`` puts the vendored tree into
the installed client's packages.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from tests.sim import served

TAG = "v36.0.3"
COMMIT = "67e7d9abfc6fe6629fa650d9b0abf4c99ef8c39c"
VENDORED = Path(__file__).resolve().parent / "kubernetes_client_e2e"
PLUGIN = "spotguard_client_e2e_plugin"
SUITES = ("kubernetes/e2e_test", "kubernetes/aio/e2e_test")
# git blob ids at the tag (``git ls-tree -r v36.0.3 ...``): the vendored files, unmodified
MANIFEST = {
    "LICENSE": "00b2401109fde1bdf246464852bb3791e497b9ff",
    "kubernetes/aio/e2e_test/__init__.py": "19f5e722fb9336c5e78491e31da2d941cbf11d8c",
    "kubernetes/aio/e2e_test/base.py": "80276d01ecb8b496ea956a40af1f0c4d8a84e6d3",
    "kubernetes/aio/e2e_test/test_api.py": "1d911d8c4e56b648903139d2464caa0e4445e56e",
    "kubernetes/aio/e2e_test/test_apply_patch.py": "c8c10b8abb379364646fc90d054c643d0df1953b",
    "kubernetes/aio/e2e_test/test_batch.py": "8926cd9b56c63434f705a4a09ce0dd277bdf98fc",
    "kubernetes/aio/utils/__init__.py": "b1244b9a0e532176b9602c0dd115e21c97f5146a",
    "kubernetes/aio/utils/create_from_yaml.py": "b59d091f688eee4b943eec5bb36b17ed0eec3133",
    "kubernetes/e2e_test/__init__.py": "06807476446667a727297affd055aff74fdb0765",
    "kubernetes/e2e_test/base.py": "9ccc1e7922c4d37e40f02bb46571ade89ba02504",
    "kubernetes/e2e_test/port_server.py": "2fb5f0ccf5bd819eeaa17ded03e34833d8c01f5b",
    "kubernetes/e2e_test/test_apps.py": "f4f333a055793d4026dbc77661fd4873658bb4de",
    "kubernetes/e2e_test/test_batch.py": "bb2bbb63c75a9884ad617fbe419a0057252d3a41",
    "kubernetes/e2e_test/test_client.py": "7f6c80559e672526b128442f2189b7ab456f3b69",
    "kubernetes/e2e_test/test_informer.py": "ffcb90df355664a16062a36ead6ed7b8712a0426",
    "kubernetes/e2e_test/test_utils.py": "a1789ae7fe5750d7edb36efbabe995e3b20cd2a5",
    "kubernetes/e2e_test/test_watch.py": "6879d6d3500838a5babfd7e568b947788dbc4c0a",
    "kubernetes/e2e_test/test_yaml/api-service.yaml": "b26d1e44d95675c4c8ea920a824817de36040b6f",
    "kubernetes/e2e_test/test_yaml/apps-deployment-2.yaml": "b2acb92f82b00817bc1e92f3fb496b39420707a6",
    "kubernetes/e2e_test/test_yaml/apps-deployment.yaml": "eb33bbac559454ad9e7e96214f92c96c41ea8681",
    "kubernetes/e2e_test/test_yaml/core-namespace.yaml": "dc475a757c9e76fa05a9e8d9270e37bf55f2270c",
    "kubernetes/e2e_test/test_yaml/core-pod.yaml": "8276a37fb5632f9386ed7062b1df5521c669c286",
    "kubernetes/e2e_test/test_yaml/core-service.yaml": "a805c9116cd6df33bbaf1e334d088daa79fde3d4",
    "kubernetes/e2e_test/test_yaml/dep-deployment.yaml": "57170d92a4ac6a9ff72ff2bc01276a31e6ce8447",
    "kubernetes/e2e_test/test_yaml/dep-namespace.yaml": "38df99628cc892451e16d7b6cebbe3c6385e8096",
    "kubernetes/e2e_test/test_yaml/implicit-svclist.json": "46aa90dc87f364334e411d3c88ebea9f143d05cd",
    "kubernetes/e2e_test/test_yaml/list.yaml": "15aab9ad5cb518ba180db1e47efed39138921497",
    "kubernetes/e2e_test/test_yaml/multi-resource-with-list.yaml": "996e4b696159b5889c62ab4ed069aa8bb349c10e",
    "kubernetes/e2e_test/test_yaml/multi-resource.yaml": "7052b575afe3f35c17344d8a80d24978e4ffb406",
    "kubernetes/e2e_test/test_yaml/multi-resource/multi-resource-replication-controller.yaml": "e644305ab62e32f0ef1feb40fb4ce0a6a968df37",  # noqa: E501
    "kubernetes/e2e_test/test_yaml/multi-resource/multi-resource-service.yaml": "2e3a9fa06df1d50dd653c13a9e538cad462d457c",  # noqa: E501
    "kubernetes/e2e_test/test_yaml/namespace-list.yaml": "c6900685ba2c7d79e0885ec539ad36ea77c921c1",
    "kubernetes/e2e_test/test_yaml/rbac-role.yaml": "404204d978da2e803ec2bc608d444aa8f611d228",
    "kubernetes/e2e_test/test_yaml/triple-nginx.yaml": "a071c88b50f7ba8912dc7039678291029d90bc2b",
    "kubernetes/e2e_test/test_yaml/yaml-conflict-first.yaml": "73e9376369b10fd630a14edaf21ecfd781f27e62",
    "kubernetes/e2e_test/test_yaml/yaml-conflict-multi.yaml": "6a5cf16c2925e7a528e65f50132a5f2cea609712",
}

_CLIENT = "kubernetes/e2e_test/test_client.py::TestClient"
_EXEC = ("no container runs in the simulated cluster: pods/exec (a websocket) is not served, "
         "so there is no process to exec into")
_FORWARD = "no container runs in the simulated cluster: pods/portforward is not served, nothing listens"
_APPLY = ("server-side apply (PATCH application/apply-patch+yaml) is not served: the simulated "
          "cluster answers 415 UnsupportedMediaType (docs/sim.md 'Not served'), so this fails loudly "
          "here rather than passing by a silent create or merge")
DESELECTED = {
    f"{_CLIENT}::test_pod_apis": f"execs into its pod (stream connect_get_namespaced_pod_exec); {_EXEC}",
    f"{_CLIENT}::test_exit_code": f"execs commands in its pod and reads their exit codes; {_EXEC}",
    f"{_CLIENT}::test_pod_exec_close_channel":
        f"execs cat in its pod over v5.channel.k8s.io and closes stdin; {_EXEC}",
    f"{_CLIENT}::test_portforward_raw": f"port-forwards to port_server.py in its pod; {_FORWARD}",
    f"{_CLIENT}::test_portforward_http": f"port-forwards to nginx in its pod; {_FORWARD}",
    "kubernetes/e2e_test/test_utils.py::TestUtils::test_create_apps_deployment_from_yaml_with_apply_is_idempotent":
        f"its second create_from_yaml passes apply=True; {_APPLY}",
    "kubernetes/aio/e2e_test/test_apply_patch.py::TestApplyPatch::test_apply_patch":
        f"creates a ConfigMap by server-side apply; {_APPLY}",
}
# the test's own skip, as on any cluster without metrics-server (upstream's kind cluster
# included): metrics.k8s.io is an add-on's aggregated API, not kube-apiserver's, and the
# simulated cluster runs none (404); the pod it starts does reach Running first
SKIPPED = {"kubernetes.e2e_test.test_utils.TestUtils.test_metrics_utilities_integration": "Metrics API unavailable"}
_UTILS = "kubernetes.e2e_test.test_utils.TestUtils"
_INFORMER = "kubernetes.e2e_test.test_informer.TestSharedInformerE2E"
PASSING = {
    "kubernetes.e2e_test.test_apps.TestClientApps.test_create_daemonset",
    "kubernetes.e2e_test.test_apps.TestClientApps.test_create_deployment",
    "kubernetes.e2e_test.test_batch.TestClientBatch.test_job_apis",
    "kubernetes.e2e_test.test_client.TestClient.test_configmap_apis",
    "kubernetes.e2e_test.test_client.TestClient.test_node_apis",
    "kubernetes.e2e_test.test_client.TestClient.test_replication_controller_apis",
    "kubernetes.e2e_test.test_client.TestClient.test_service_apis",
    f"{_INFORMER}.test_added_event_and_cache_entry",
    f"{_INFORMER}.test_cache_populated_after_start",
    f"{_INFORMER}.test_deleted_event_removes_from_cache",
    f"{_INFORMER}.test_modified_event_and_cache_refresh",
    f"{_INFORMER}.test_resource_version_advances",
    f"{_INFORMER}.test_resync_fires_modified_for_existing_objects",
    f"{_UTILS}.test_create_apiservice_from_yaml_with_conflict",
    f"{_UTILS}.test_create_apps_deployment_from_yaml",
    f"{_UTILS}.test_create_apps_deployment_from_yaml_obj",
    f"{_UTILS}.test_create_apps_deployment_from_yaml_object",
    f"{_UTILS}.test_create_deployment_non_default_namespace_from_yaml",
    f"{_UTILS}.test_create_from_list_in_multi_resource_yaml",
    f"{_UTILS}.test_create_from_list_in_multi_resource_yaml_namespaced",
    f"{_UTILS}.test_create_from_multi_resource_yaml",
    f"{_UTILS}.test_create_from_multi_resource_yaml_with_conflict",
    f"{_UTILS}.test_create_from_multi_resource_yaml_with_multi_conflicts",
    f"{_UTILS}.test_create_general_list_from_yaml",
    f"{_UTILS}.test_create_implicit_service_list_from_yaml_with_conflict",
    f"{_UTILS}.test_create_multi_resource_from_directory",
    f"{_UTILS}.test_create_namespace_from_yaml",
    f"{_UTILS}.test_create_namespace_list_from_yaml",
    f"{_UTILS}.test_create_namespaced_apps_deployment_from_yaml",
    f"{_UTILS}.test_create_pod_from_yaml",
    f"{_UTILS}.test_create_rbac_role_from_yaml",
    f"{_UTILS}.test_create_rbac_role_from_yaml_with_verbose_enabled",
    f"{_UTILS}.test_create_service_from_yaml",
    "kubernetes.e2e_test.test_utils.TestUtilsUnitTests.test_format_quantity",
    "kubernetes.e2e_test.test_utils.TestUtilsUnitTests.test_parse_quantity",
    "kubernetes.e2e_test.test_watch.TestClient.test_watch_configmaps",
    "kubernetes.aio.e2e_test.test_api.TestClientApi.test_create_daemonset",
    "kubernetes.aio.e2e_test.test_api.TestClientApi.test_create_deployment",
    "kubernetes.aio.e2e_test.test_api.TestClientApi.test_create_deployment_from_yaml_file",
    "kubernetes.aio.e2e_test.test_batch.TestClientBatch.test_job_apis",
}
__doc__ = (__doc__ or "") + "\nDeselected:\n" + "".join(f"\n- ``{k}``: {v}" for k, v in DESELECTED.items()) + "\n"


@dataclass
class Outcome:
    results: dict[str, tuple[str, str]]  # classname.name: (passed|failed|error|skipped, message)
    deselected: int
    returncode: int
    report: str


def blob_id(path: Path) -> str:
    """The file's git blob id (``git hash-object``)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def drift(root: Path) -> list[str]:
    """The files under ``root`` that differ from ``MANIFEST``, are missing, or are extra
    (``LICENSE`` and the ``kubernetes/`` tree; spotguard's plugin aside)."""
    found = {str(p.relative_to(root)) for p in (root / "kubernetes").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    if (root / "LICENSE").is_file():
        found.add("LICENSE")
    problems = [f"extra: {p}" for p in sorted(found - set(MANIFEST))]
    for path, blob in MANIFEST.items():
        if path not in found:
            problems.append(f"missing: {path}")
        elif blob_id(root / path) != blob:
            problems.append(f"changed: {path}")
    return problems


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        marks = [child for child in case if child.tag in ("failure", "error", "skipped")]
        kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            marks[0].tag if marks else "", "passed")
        message = (marks[0].get("message") or "") if marks else ""
        found[f"{case.get('classname')}.{case.get('name')}"] = (kind, message)
    return found


def run(suite: Path, tmp: Path, timeout: float = 300) -> Outcome:
    """Copy ``suite`` (a tree as ``VENDORED``: ``kubernetes/``, the plugin) into ``tmp`` and
    run its e2e files there in a pytest subprocess against a fresh ``spotguard sim serve``."""
    root = tmp / "suite"
    shutil.copytree(suite, root, ignore=shutil.ignore_patterns("__pycache__"))
    if not (root / f"{PLUGIN}.py").is_file():
        shutil.copy(VENDORED / f"{PLUGIN}.py", root)
    ini = tmp / "pytest.ini"  # not the repository's settings
    # upstream's modules keep their names (kubernetes.e2e_test.test_batch beside
    # kubernetes.aio.e2e_test.test_batch): kubernetes/ has no __init__.py here
    ini.write_text("[pytest]\nconsider_namespace_packages = true\ntimeout = 180\n")
    junit = tmp / "junit.xml"
    with served.serving(tmp) as kubeconfig:
        args = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(root),
                "-p", "no:cacheprovider", "-p", PLUGIN, "-q", "-rfEs", f"--junitxml={junit}", *SUITES]
        for node_id in DESELECTED:  # relative to the rootdir
            args += ["--deselect", node_id]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env |= {"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        result = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
                                check=False)
    report = result.stdout[-8000:] + result.stderr[-2000:]
    left_out = re.search(r"(\d+) deselected", result.stdout)
    return Outcome(outcomes(junit) if junit.is_file() else {}, int(left_out.group(1)) if left_out else 0,
                   result.returncode, report)


def problems(outcome: Outcome) -> list[str]:
    """How the outcome differs from the one recorded here (empty when it is that one)."""
    found = []
    got = outcome.results
    for name in sorted(PASSING):
        if got.get(name, ("missing", ""))[0] != "passed":
            found.append(f"{name}: {got.get(name, ('not run', ''))}")
    for name, reason in SKIPPED.items():
        if got.get(name) != ("skipped", reason):
            found.append(f"{name}: {got.get(name, ('not run', ''))}, expected skipped: {reason}")
    found += [f"{name}: {got[name]} (not recorded)" for name in sorted(set(got) - PASSING - set(SKIPPED))]
    if outcome.deselected != len(DESELECTED):
        found.append(f"{outcome.deselected} deselected, expected {len(DESELECTED)}")
    if outcome.returncode != 0:
        found.append(f"pytest exited {outcome.returncode}")
    return found


def extract(checkout: str, dest: Path) -> Path:
    """The vendored paths at ``TAG`` from a kubernetes-client/python checkout or bare clone."""
    archive = subprocess.run(["git", "-C", checkout, "archive", "--format=tar", TAG, *sorted(MANIFEST)],
                             capture_output=True, check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m tests.sim.upstream_client_e2e [CHECKOUT of kubernetes-client/python]",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        suite = VENDORED
        if argv:
            suite = extract(argv[0], Path(tmp) / "tag")
            changed = drift(suite)
            if changed:  # the tag's files are not the ones MANIFEST records
                print(f"{argv[0]} at {TAG}: " + "; ".join(changed), file=sys.stderr)
                return 1
            vendored = drift(VENDORED)
            if vendored:
                print("the vendored copy differs from the tag: " + "; ".join(vendored), file=sys.stderr)
                return 1
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        outcome = run(suite, run_dir)
    for name, (kind, message) in sorted(outcome.results.items()):
        print(f"{kind:8} {name}" + (f": {message}" if message and kind != "passed" else ""))
    print(f"deselected {outcome.deselected}")
    wrong = problems(outcome)
    if wrong:
        print("not the recorded outcome:\n" + "\n".join(wrong) + "\n" + outcome.report, file=sys.stderr)
        return 1
    print(f"the official client's e2e files at {TAG} ran against spotguard sim serve: {len(PASSING)} passed, "
          f"{len(SKIPPED)} skipped, {len(DESELECTED)} deselected (the recorded outcome)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
