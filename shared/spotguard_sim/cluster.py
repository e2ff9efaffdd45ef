"""A whole simulated cluster: store, API server, kubeconfig and (B's) controllers."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spotguard_sim import admission, routes, server, settings, store
from spotguard_sim import clock as clock_mod
from spotguard_sim import cloud as cloud_mod
from spotguard_sim import faults as faults_mod
from spotguard_sim import kubeconfig as kubeconfig_mod

log = logging.getLogger("spotguard.sim.cluster")

TERMINATE_AT = "sim.spotguard.io/terminate-at"
INSTANCE_ACTION = "sim.spotguard.io/instance-action"


class SimCluster:
    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        *,
        time_scale: float = 1.0,
        tls: bool = True,
        port: int = 0,
    ) -> None:
        self.clock = clock_mod.Clock(time_scale)
        self.store = store.Store(self.clock, admission=admission)  # the webhooks on every write
        self.faults = faults_mod.Faults()
        self.kubeconfig = str(kubeconfig)
        self.token = server.ADMIN_TOKEN
        self._tls = tls
        self._port = port
        self._server: server.ApiServer | None = None
        self.controllers: Any = None
        self.settings = settings.Settings()
        self.cloud = cloud_mod.of(self.store)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._server.url

    @property
    def ca_pem(self) -> bytes | None:
        return self._server.cert.cert_pem if self._server and self._server.cert else None

    def start(
        self,
        scenario: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
        *,
        controllers: bool = True,
        drainer: bool = False,
        ready_delay_seconds: float = 0.0,
        termination_seconds: float = 1.0,
        sim_settings: settings.Settings | None = None,
    ) -> None:
        """Load ``scenario`` (its ``kind: Settings`` document sets the timings, unless
        ``sim_settings`` is given) and start the API server and the controllers."""
        if scenario is not None:
            from spotguard_sim import scenario as scenario_mod

            found, objects = settings.split(scenario_mod.load(scenario))
            self.settings = found
            self.store.apply_objects(objects)
        if sim_settings is not None:
            self.settings = sim_settings
        self.store.set_compaction_interval(self.settings.api_server.etcd_compaction_interval)
        self._server, _ = server.start(
            routes.Api(self.store), port=self._port, tls_enabled=self._tls, fault_set=self.faults
        )
        if controllers:
            from spotguard_sim import controllers as controllers_mod

            self.controllers = controllers_mod.start_all(
                self.store,
                ready_delay_seconds=ready_delay_seconds,
                termination_seconds=termination_seconds,
                drainer=drainer,
                settings=self.settings,
            )
        kubeconfig_mod.write(self.kubeconfig, self.url, self.token, self.ca_pem)

    def stop(self) -> None:
        if self.controllers is not None:
            try:
                self.controllers.stop()
            except Exception:
                log.exception("stopping the controllers failed")
            self.controllers = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.store.close()

    def api_client(self, token: str | None = None, *, impersonate: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` configured for this cluster: the admin, or
        ``token``'s user; ``impersonate`` sends ``Impersonate-User`` (a service account's
        ``system:serviceaccount:<ns>:<name>`` gets its groups)."""
        import kubernetes

        config = kubernetes.client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": f"Bearer {token or self.token}"}
        ca = self.ca_pem
        if ca is not None:
            ca_path = Path(self.kubeconfig).with_name("ca.crt")
            if not ca_path.exists():
                ca_path.write_bytes(ca)
            config.ssl_ca_cert = str(ca_path)
        else:
            config.verify_ssl = False
        if impersonate is not None:
            return kubernetes.client.ApiClient(config, header_name="Impersonate-User", header_value=impersonate)
        return kubernetes.client.ApiClient(config)

    def _api(self) -> Any:
        if self._server is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._server.api

    def service_account_token(self, namespace: str, name: str, seconds: int = 7 * 24 * 3600) -> str:
        """A token for ServiceAccount ``namespace/name`` (it must exist), as ``kubectl create
        token --duration`` issues it; valid ``seconds`` of simulated time."""
        return str(self._api().authenticator.issue(namespace, name, seconds)[0])

    def client_certificate(self, user: str, groups: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """A client certificate (PEM) and its key for ``user`` in ``groups``, signed by the
        cluster's client CA."""
        if self._server is None or self._server.client_ca is None:
            raise RuntimeError("client certificates need the TLS server")
        return self._server.client_ca.issue(user, groups)

    def map_aws_access_key(self, access_key_id: str, username: str, groups: tuple[str, ...] = ()) -> None:
        """An EKS access entry: a ``k8s-aws-v1.`` token signed with ``access_key_id`` is
        ``username`` in ``groups`` (EKS maps the IAM principal; STS is not called)."""
        self._api().authenticator.map_aws_access_key(access_key_id, username, groups)

    def write_kubeconfig(self, path: str | os.PathLike[str], *, token: str | None = None,
                         client_cert: tuple[bytes, bytes] | None = None) -> str:
        """A kubeconfig for this cluster acting as ``token``'s or ``client_cert``'s user."""
        return str(kubeconfig_mod.write(path, self.url, token, self.ca_pem, client_cert))

    def reclaim(self, node_names: Iterable[str], after_seconds: float = 120.0,
                action: str | None = None) -> None:
        """Annotate nodes to lose their instance ``after_seconds`` of simulated time from now,
        by ``action`` (terminate, stop, hibernate; the scenario's ``nodeLoss.instanceAction``
        when None). The API learns it only as a real one would (see docs/sim.md)."""
        if action is not None and action not in settings.INSTANCE_ACTIONS:
            raise ValueError(f"action must be one of {settings.INSTANCE_ACTIONS}, got {action!r}")
        when = self.clock.iso(self.clock.now() + after_seconds)

        def annotate(node: dict[str, Any]) -> None:
            notes = node["metadata"].setdefault("annotations", {})
            notes[TERMINATE_AT] = when
            if action is not None:
                notes[INSTANCE_ACTION] = action

        for name in node_names:
            self.store.mutate("nodes", name, None, annotate)

    def serving(self, pod: Mapping[str, Any]) -> bool:
        """Whether a pod really serves: Ready in the API and on a node whose instance runs."""
        from spotguard_sim import readiness

        return readiness.serving(pod, self.cloud)
