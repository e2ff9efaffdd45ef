"""The admission Lambda's public Function URL admits only callers that know its secret.

GIVEN the admission Lambda configured as infra/aws/template.yaml deploys it: the
webhook secret in Secrets Manager (moto in server mode), named by
``SPOTGUARD_WEBHOOK_SECRET_ARN``, and a simulated cluster with a Deployment
WHEN a pod review arrives as a Function URL event (payload format 2.0), with the
path kube-apiserver would call (``/<secret>/mutate``), without the secret, or with
a wrong one
THEN only the call with the secret is answered (a placement, and the reservation
Lease written); the others get 404 and change nothing in the cluster; a secret
that cannot be read answers 503 and changes nothing either.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r

from tests.admission import cluster
from tests.admission.test_entrypoints import (
    FUNCTION_DIR,
    cluster_env,
    function_url_event,
    load_module,
    review_for,
    sim_env,
)
from tests.interruption.transport_support import Moto, aws_env, moto_server, unique

__all__ = ["aws_env", "cluster_env", "moto_server", "sim_env"]  # fixtures

_modules = itertools.count()


@pytest.fixture
def secret(aws_env: Moto, cluster_env: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> str:
    """A generated secret, as the template's AdmissionWebhookSecret makes it."""
    sm = aws_env.client("secretsmanager")
    value = sm.get_random_password(PasswordLength=48, ExcludePunctuation=True)["RandomPassword"]
    arn = sm.create_secret(Name=unique("spotguard-webhook"), SecretString=value)["ARN"]
    monkeypatch.setenv("SPOTGUARD_WEBHOOK_SECRET_ARN", arn)
    monkeypatch.delenv("SPOTGUARD_WEBHOOK_SECRET", raising=False)
    return str(value)


@pytest.fixture
def function() -> Iterator[ModuleType]:
    """A cold start: the module (and its cached secret) loaded afresh."""
    yield load_module(f"spotguard_admission_lambda_secret_{next(_modules)}", FUNCTION_DIR / "lambda_function.py")


def leases(sim: Any) -> list[str]:
    k = kube.Kube(sim.api_client())
    return sorted(lease["metadata"]["name"] for lease in k.list(r.LEASES, "spotguard"))


def call(function: ModuleType, rs: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    review = review_for(rs)
    return review, function.lambda_handler(function_url_event(json.dumps(review).encode(), path=path), None)


def test_a_call_without_the_secret_is_refused_and_changes_nothing(
    secret: str, function: ModuleType, cluster_env: tuple[Any, dict[str, Any]]
) -> None:
    sim, rs = cluster_env
    before = leases(sim)
    wrong = secret[:-1] + ("a" if secret[-1] != "a" else "b")
    for path in ("/mutate", "/", f"/{wrong}/mutate", f"/{secret[:20]}/mutate", "/evictions", f"/mutate/{secret}"):
        _, answer = call(function, rs, path)
        assert answer["statusCode"] == 404, path
        assert "response" not in json.loads(answer["body"])
        assert secret not in answer["body"]
    health = function.lambda_handler(function_url_event(b"", method="GET", path="/healthz"), None)
    assert health["statusCode"] == 404
    assert leases(sim) == before

    review, answer = call(function, rs, f"/{secret}/mutate")
    assert answer["statusCode"] == 200
    body = json.loads(answer["body"])
    assert body["response"]["uid"] == review["request"]["uid"]
    assert any(op["path"] == "/metadata/labels/spotguard.io~1placement" for op in cluster.patch_of(body))
    assert len(leases(sim)) > len(before)
    health = function.lambda_handler(function_url_event(b"", method="GET", path=f"/{secret}/healthz"), None)
    assert health["statusCode"] == 200


def test_a_secret_that_cannot_be_read_refuses_every_call(
    aws_env: Moto, cluster_env: tuple[Any, dict[str, Any]], function: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, rs = cluster_env
    monkeypatch.setenv(
        "SPOTGUARD_WEBHOOK_SECRET_ARN", "arn:aws:secretsmanager:us-east-2:123456789012:secret:gone-AbCdEf"
    )
    before = leases(sim)
    for path in ("/mutate", "/anything/mutate"):
        _, answer = call(function, rs, path)
        assert answer["statusCode"] == 503
    assert leases(sim) == before


def test_a_short_secret_is_refused(
    cluster_env: tuple[Any, dict[str, Any]], function: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPOTGUARD_WEBHOOK_SECRET_ARN", raising=False)
    monkeypatch.setenv("SPOTGUARD_WEBHOOK_SECRET", "short")
    _, answer = call(function, cluster_env[1], "/short/mutate")
    assert answer["statusCode"] == 503
