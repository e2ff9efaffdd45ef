"""Who may call the admission Lambda's Function URL: a shared secret in the URL path.

A Function URL is on the internet, and kube-apiserver cannot sign its webhook
calls (SigV4), so the URL's ``AuthType`` is ``NONE``. kube-apiserver does send
the webhook's ``clientConfig.url`` as it is written, and a webhook URL may
carry a path but no query (the API refuses ``?`` and ``#`` in it). So the
caller proves itself with a secret as the path's first segment::

    https://<url-id>.lambda-url.<region>.on.aws/<secret>/mutate
    https://<url-id>.lambda-url.<region>.on.aws/<secret>/evictions

The secret is read once per execution environment from Secrets Manager
(``SPOTGUARD_WEBHOOK_SECRET_ARN``, what infra/aws/template.yaml sets; the
template generates it) or from ``SPOTGUARD_WEBHOOK_SECRET`` (the value itself).
It is compared in constant time (:func:`hmac.compare_digest`). A request
without it is answered 404 before anything else happens: no cluster
connection, no Lease, no log of the path. Without either variable every
caller is accepted, and the cold start logs a warning saying so (the
in-cluster shapes, whose Service is not on the internet, need none).

Whoever can read the MutatingWebhookConfiguration (or the API server's logs,
which name the URL when a call fails) can read the secret: it keeps out the
internet, not the cluster's own administrators. What a forged call can cost
is bounded by the function's reserved concurrency (the template's
AdmissionReservedConcurrency).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

SECRET_ENV = "SPOTGUARD_WEBHOOK_SECRET"
SECRET_ARN_ENV = "SPOTGUARD_WEBHOOK_SECRET_ARN"
# Below this a secret is guessable; Secrets Manager's generated one is 48 characters.
MIN_LENGTH = 32


class SecretUnavailable(Exception):
    """The secret is configured but cannot be read (Secrets Manager unreachable, no permission)."""


@dataclass(frozen=True)
class Gate:
    """The secret the path must start with; ``None``: every caller is accepted."""

    secret: str | None

    def admit(self, path: str) -> str | None:
        """The path without its secret segment, or None where the secret is wrong or missing."""
        if self.secret is None:
            return path
        first, _, rest = path.lstrip("/").partition("/")
        if not hmac.compare_digest(first.encode("utf-8", "surrogatepass"), self.secret.encode()):
            return None
        return "/" + rest


def check_secret(secret: str) -> str:
    """The secret if it can go in a URL path and is long enough, else ValueError."""
    if len(secret) < MIN_LENGTH:
        raise ValueError(f"the webhook secret must be at least {MIN_LENGTH} characters")
    if not secret.isascii() or not all(c.isalnum() or c in "-_" for c in secret):
        raise ValueError("the webhook secret may hold only letters, digits, '-' and '_' (it is a URL path segment)")
    return secret


def from_secrets_manager(secret_id: str) -> str:
    import boto3

    try:
        answer = boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)
    except Exception as exc:  # botocore's ClientError, EndpointConnectionError, ...
        raise SecretUnavailable(f"cannot read the webhook secret {secret_id}: {type(exc).__name__}") from exc
    value = answer.get("SecretString")
    if not isinstance(value, str):
        raise SecretUnavailable(f"the webhook secret {secret_id} holds no SecretString")
    return value.strip()


def from_environment() -> Gate:
    """The gate the environment configures (see the module docstring)."""
    arn = os.environ.get(SECRET_ARN_ENV, "").strip()
    if arn:
        return Gate(check_secret(from_secrets_manager(arn)))
    value = os.environ.get(SECRET_ENV, "").strip()
    if value:
        return Gate(check_secret(value))
    log.warning(
        "no webhook secret is configured: the Function URL accepts any caller",
        extra={"settings": f"{SECRET_ARN_ENV} or {SECRET_ENV}"},
    )
    return Gate(None)


class Cached:
    """The gate, read on first use and kept; a failed read is tried again next time."""

    def __init__(self, read: Callable[[], Gate] | None = None) -> None:
        self._read = read or from_environment
        self._gate: Gate | None = None
        self._lock = threading.Lock()

    def get(self) -> Gate:
        with self._lock:
            if self._gate is None:
                self._gate = self._read()
            return self._gate
