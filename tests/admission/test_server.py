"""The real server: gunicorn over HTTPS (TLS 1.2+), health, metrics, and bad input.

No cluster is configured here, so every pod is allowed without a patch and
/readyz says not ready; what matters is the HTTP and TLS behaviour, and that
no input makes it answer a 5xx or a denial, or fall over.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.admission import cluster, servers

PAYLOADS = Path(__file__).parent / "payloads"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    workdir = tmp_path_factory.mktemp("admission-server")
    tls = servers.make_certs(workdir / "tls")
    with servers.running(tls, workdir, workers=2, threads=4) as s:
        yield s


def post(server: servers.Server, body: bytes, path: str = "/mutate", **kw: Any) -> requests.Response:
    return requests.post(
        server.url + path, data=body, verify=server.ca, timeout=10, headers={"Content-Type": "application/json"}, **kw
    )


def assert_never_5xx_nor_denied(response: requests.Response) -> None:
    assert response.status_code < 500, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    if response.status_code == 200:
        assert body["response"]["allowed"] is True
    else:
        assert 400 <= response.status_code < 500
        assert body["error"] and body["reason"]


def test_health_ready_and_metrics(server: servers.Server) -> None:
    assert requests.get(server.url + "/healthz", verify=server.ca, timeout=5).text == "ok"
    ready = requests.get(server.url + "/readyz", verify=server.ca, timeout=5)
    assert ready.status_code == 503  # no cluster configured
    assert "no Kubernetes cluster configured" in ready.text
    post(server, (PAYLOADS / "deployment-pod.json").read_bytes())
    metrics = requests.get(server.url + "/metrics", verify=server.ca, timeout=5).text
    assert "spotguard_admission_requests_total" in metrics
    assert "spotguard_admission_duration_seconds_bucket" in metrics


def test_a_real_review_without_a_cluster_is_allowed_without_a_patch(server: servers.Server) -> None:
    review = json.loads((PAYLOADS / "deployment-pod.json").read_text())
    response = post(server, json.dumps(review).encode())
    assert response.status_code == 200
    assert response.json()["response"] == {
        "uid": review["request"]["uid"],
        "allowed": True,
        "auditAnnotations": {"spotguard.io/decision": "failed_open: internal error: RuntimeError"},
    }


def test_a_reinvoked_pod_needs_no_cluster(server: servers.Server) -> None:
    review = json.loads((PAYLOADS / "deployment-pod-reinvocation.json").read_text())
    response = post(server, json.dumps(review).encode())
    assert cluster.patch_of(response.json()) == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_below_1_2_is_refused(server: servers.Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=server.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(server.ca)
    old.set_ciphers("ALL:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, pytest.raises(ssl.SSLError):
        old.wrap_socket(raw, server_hostname="localhost")


def test_plain_http_gets_no_answer(server: servers.Server) -> None:
    with pytest.raises(requests.RequestException):
        requests.get(server.url.replace("https", "http") + "/healthz", timeout=5)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "NotJSON"),
        (b"\xff\xfe\x00", 400, "NotJSON"),
        (b"[]", 400, "WrongType"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "a"}}',
            400,
            "WrongType",
        ),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 400, "MissingRequest"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
            b'"request": {"uid": "a", "operation": "CREATE", '
            b'"resource": {"group": "", "version": "v1", "resource": "pods"}}}',
            400,
            "MissingObject",
        ),
        (b"[" * 100_000, 400, "NotJSON"),
        (b" " * (3 * 1024 * 1024 + 10), 413, "BodyTooLarge"),
    ],
)
def test_malformed_requests_get_a_clear_4xx_json_error(
    server: servers.Server, body: bytes, status: int, reason: str
) -> None:
    response = post(server, body)
    assert response.status_code == status
    assert response.json()["reason"] == reason


def test_a_chunked_huge_body_is_refused_with_413(server: servers.Server) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b" " * (1024 * 1024)

    response = post(server, chunks())  # type: ignore[arg-type]
    assert response.status_code == 413


def test_a_non_pod_resource_is_allowed_without_a_patch(server: servers.Server) -> None:
    review = cluster.review({"metadata": {"name": "cm"}}, "shop")
    review["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    response = post(server, json.dumps(review).encode())
    assert response.status_code == 200
    assert cluster.patch_of(response.json()) == []


def test_wrong_methods_and_paths_are_4xx(server: servers.Server) -> None:
    assert requests.get(server.url + "/mutate", verify=server.ca, timeout=5).status_code == 405
    assert requests.post(server.url + "/healthz", verify=server.ca, timeout=5).status_code == 405
    assert requests.get(server.url + "/nope", verify=server.ca, timeout=5).status_code == 404


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
REVIEW = json.loads((PAYLOADS / "deployment-pod.json").read_text())


def _mutated_review(path: list[str], value: Any) -> dict[str, Any]:
    review = json.loads(json.dumps(REVIEW))
    target = review
    for key in path[:-1]:
        nxt = target.get(key) if isinstance(target, dict) else None
        if not isinstance(nxt, dict):
            return review
        target = nxt
    target[path[-1]] = value
    return review


FIELDS = [
    ["apiVersion"],
    ["kind"],
    ["request"],
    ["request", "uid"],
    ["request", "object"],
    ["request", "resource"],
    ["request", "operation"],
    ["request", "namespace"],
    ["request", "dryRun"],
    ["request", "object", "metadata"],
    ["request", "object", "spec"],
    ["request", "object", "metadata", "labels"],
    ["request", "object", "metadata", "ownerReferences"],
    ["request", "object", "metadata", "annotations"],
    ["request", "object", "spec", "affinity"],
    ["request", "object", "spec", "tolerations"],
    ["request", "object", "spec", "containers"],
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_random_bodies_never_get_a_5xx_or_a_denial(server: servers.Server, body: bytes) -> None:
    assert_never_5xx_nor_denied(post(server, body))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=json_values)
def test_reviews_with_a_field_replaced_never_get_a_5xx_or_a_denial(
    server: servers.Server, field: list[str], value: Any
) -> None:
    assert_never_5xx_nor_denied(post(server, json.dumps(_mutated_review(field, value)).encode()))


def test_the_server_is_still_up_after_the_bad_input(server: servers.Server) -> None:
    assert server.process.poll() is None
    assert requests.get(server.url + "/healthz", verify=server.ca, timeout=5).ok
