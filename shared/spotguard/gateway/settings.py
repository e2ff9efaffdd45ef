"""The cluster-wide :class:`~spotguard.policy.config.Config`: environment, then the ConfigMap.

Precedence, lowest to highest:

1. the defaults in :class:`spotguard.policy.config.Config`;
2. environment variables ``SPOTGUARD_<SETTING>`` (set when a function is deployed);
3. the ConfigMap ``spotguard-config`` in ``$SPOTGUARD_NAMESPACE`` (default
   ``spotguard``; name from ``$SPOTGUARD_CONFIGMAP``), keys ``<setting>`` in lower
   case with dashes (``excluded-namespaces``).

The ConfigMap wins because it is the one live, cluster-wide source that every
function reads in every shape (Knative, Lambda, local): editing it changes all
of them within the cache TTL, without a redeploy. The environment is the
baseline, and the fallback where the ConfigMap is absent or unreadable.

A missing ConfigMap is fine (environment and defaults apply). An unreadable
one (no RBAC, API down) keeps the last good configuration, or the environment
if there is none, and is reported as a problem. Invalid values and unknown
keys are problems too; every problem is logged once per process. Results are
cached for ``ttl`` seconds (``$SPOTGUARD_CONFIG_TTL_SECONDS``, default 30) so a
long-lived process does not read the ConfigMap per request.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from spotguard.gateway import errors, resources
from spotguard.gateway.kube import Kube
from spotguard.policy import config as policy_config
from spotguard.policy.config import Config
from spotguard.policy.validation import Problem

DEFAULT_NAMESPACE = "spotguard"
DEFAULT_CONFIGMAP = "spotguard-config"
DEFAULT_TTL_SECONDS = 30.0
# How long the admission webhook keeps a Deployment or StatefulSet it read (real seconds):
# node-added's move waits that long after its record, and a second more for a read in
# flight, before its "+k" (spotguard.nodeadded.reconciler). The two functions must agree:
# set it on both, or on neither.
WORKLOAD_CACHE_ENV = "SPOTGUARD_WORKLOAD_CACHE_SECONDS"
WORKLOAD_CACHE_SECONDS = 2.0
WORKLOAD_CACHE_MOST = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    namespace: str
    name: str
    ttl: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Source:
        ttl = DEFAULT_TTL_SECONDS
        raw = env.get("SPOTGUARD_CONFIG_TTL_SECONDS")
        if raw:
            try:
                ttl = max(0.0, float(raw))
            except ValueError:
                _log_once([Problem("SPOTGUARD_CONFIG_TTL_SECONDS", raw, "not a number; using 30")])
        return cls(
            namespace=env.get("SPOTGUARD_NAMESPACE") or DEFAULT_NAMESPACE,
            name=env.get("SPOTGUARD_CONFIGMAP") or DEFAULT_CONFIGMAP,
            ttl=ttl,
        )


def read(kube: Kube, env: Mapping[str, str], source: Source) -> tuple[Config, list[Problem]]:
    """One uncached read: environment, then the ConfigMap over it. Raises ApiError if unreadable."""
    base, problems = policy_config.from_env(env)
    try:
        configmap = kube.get(resources.CONFIGMAPS, source.name, source.namespace)
    except errors.NotFound:
        return base, problems
    data = configmap.get("data") or {}
    known = {policy_config.configmap_key(f) for f in policy_config.SETTINGS}
    config, more = policy_config.from_configmap(data, base)
    problems += more
    where = f"configmap {source.namespace}/{source.name}"
    problems += [
        Problem(key, str(value), f"unknown setting in {where}; ignored")
        for key, value in data.items()
        if key not in known
    ]
    return config, problems


class Loader:
    """Cached :func:`read` for one cluster and environment; thread-safe."""

    def __init__(self, kube: Kube, env: Mapping[str, str] | None = None, ttl: float | None = None) -> None:
        self.kube = kube
        self.env = dict(os.environ if env is None else env)
        source = Source.from_env(self.env)
        self.source = source if ttl is None else Source(source.namespace, source.name, ttl)
        self._lock = threading.Lock()
        self._value: tuple[Config, list[Problem]] | None = None
        self._expires = 0.0

    def get(self) -> tuple[Config, list[Problem]]:
        with self._lock:
            now = time.monotonic()
            if self._value is not None and now < self._expires:
                return self._value
            try:
                value = read(self.kube, self.env, self.source)
            except errors.ApiError as exc:
                problem = Problem(
                    "configmap",
                    f"{self.source.namespace}/{self.source.name}",
                    f"could not read ({exc}); using "
                    + ("the last configuration read" if self._value else "the environment"),
                )
                if self._value is not None:
                    value = (self._value[0], [*self._value[1], problem])
                else:
                    config, problems = policy_config.from_env(self.env)
                    value = (config, [*problems, problem])
                # Try again soon rather than a whole TTL later.
                self._expires = now + min(self.source.ttl, 5.0)
            else:
                self._expires = now + self.source.ttl
            _log_once(value[1])
            self._value = value
            return value

    def invalidate(self) -> None:
        with self._lock:
            self._expires = 0.0


_loaders: dict[tuple[int, tuple[tuple[str, str], ...]], Loader] = {}
_loaders_lock = threading.Lock()
_logged: set[str] = set()
_logged_lock = threading.Lock()


def load(kube: Kube, env: Mapping[str, str] | None = None) -> tuple[Config, list[Problem]]:
    """The configuration for ``kube`` and ``env`` (default ``os.environ``), cached for the TTL."""
    env = os.environ if env is None else env
    relevant = tuple(sorted((k, v) for k, v in env.items() if k.startswith(policy_config.ENV_PREFIX)))
    key = (id(kube), relevant)
    with _loaders_lock:
        loader = _loaders.get(key)
        if loader is None or loader.kube is not kube:
            loader = Loader(kube, dict(relevant))
            _loaders[key] = loader
    return loader.get()


def _log_once(problems: list[Problem]) -> None:
    for problem in problems:
        text = str(problem)
        with _logged_lock:
            if text in _logged:
                continue
            _logged.add(text)
        log.warning(
            "configuration problem",
            extra={"field": problem.field, "value": problem.value, "problem": problem.message},
        )


def seconds(
    env: Mapping[str, str], name: str, default: float, most: float = math.inf, logger: logging.Logger = log
) -> float:
    """The process setting ``$name`` in seconds, from 0 to ``most``; ``default`` when it is unset
    or invalid (an invalid one is logged to ``logger``). Every function's timing settings."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
        if not 0 <= value <= most:  # negative, too large, or NaN
            raise ValueError("must be a non-negative number" if most == math.inf else f"must be between 0 and {most:g}")
        return value
    except ValueError as exc:
        logger.warning("invalid setting; using the default", extra={"setting": name, "value": raw, "error": str(exc)})
        return default


def workload_cache_seconds(env: Mapping[str, str] | None = None) -> float:
    """``$SPOTGUARD_WORKLOAD_CACHE_SECONDS`` (0 to 30; default 2)."""
    return seconds(os.environ if env is None else env, WORKLOAD_CACHE_ENV, WORKLOAD_CACHE_SECONDS, WORKLOAD_CACHE_MOST)
