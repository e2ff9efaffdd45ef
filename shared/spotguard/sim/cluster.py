"""A whole simulated cluster: store, API server, kubeconfig and (B's) controllers."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spotguard.sim import clock as clock_mod
from spotguard.sim import cloud as cloud_mod
from spotguard.sim import faults as faults_mod
from spotguard.sim import kubeconfig as kubeconfig_mod
from spotguard.sim import routes, server, settings, store

log = logging.getLogger(__name__)

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
        self.store = store.Store(self.clock)
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
            from spotguard.sim import scenario as scenario_mod

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
            from spotguard.sim import controllers as controllers_mod

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

    def api_client(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` configured for this cluster."""
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
        return kubernetes.client.ApiClient(config)

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
        from spotguard.sim import readiness

        return readiness.serving(pod, self.cloud)
