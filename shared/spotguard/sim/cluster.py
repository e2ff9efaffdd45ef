"""A whole simulated cluster: store, API server, kubeconfig and (B's) controllers."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spotguard.sim import clock as clock_mod
from spotguard.sim import faults as faults_mod
from spotguard.sim import kubeconfig as kubeconfig_mod
from spotguard.sim import routes, server, store

log = logging.getLogger(__name__)

TERMINATE_AT = "sim.spotguard.io/terminate-at"


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
    ) -> None:
        if scenario is not None:
            from spotguard.sim import scenario as scenario_mod

            self.store.apply_objects(scenario_mod.load(scenario))
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

    def reclaim(self, node_names: Iterable[str], after_seconds: float = 120.0) -> None:
        """Annotate nodes to be reclaimed ``after_seconds`` of simulated time from now."""
        when = self.clock.iso(self.clock.now() + after_seconds)
        for name in node_names:
            self.store.mutate(
                "nodes", name, None,
                lambda node: node["metadata"].setdefault("annotations", {}).__setitem__(
                    TERMINATE_AT, when),
            )
