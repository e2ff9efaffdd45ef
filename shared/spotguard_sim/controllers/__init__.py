"""The simulated cluster's controllers, kubelet, drainer and scheduler.

``start_all(store, ...)`` starts them in background threads fed by one
``store.subscribe`` callback; ``Controllers.stop()`` stops them all.
"""

from __future__ import annotations

import logging
from typing import Any

from spotguard_sim import billing
from spotguard_sim import settings as settings_mod
from spotguard_sim.controllers import (
    apiservices,
    autoscaler,
    base,
    clusterroleaggregation,
    completion,
    consolidation,
    cronjob,
    daemonset,
    deployment,
    drainer,
    events,
    hpa,
    instances,
    job,
    kubelet,
    nodes,
    pdb,
    podgc,
    provisioner,
    replicaset,
    replicationcontroller,
    resourcequota,
    scheduling,
    serviceaccounts,
    statefulset,
    tainteviction,
)

log = logging.getLogger("spotguard.sim.controllers")
INFORMED = ("pods", "nodes", "replicasets", "deployments", "statefulsets",
            "poddisruptionbudgets", "horizontalpodautoscalers", "daemonsets",
            "replicationcontrollers", "jobs", "cronjobs", "nodepools", "nodeclaims")


def _workload_controllers(store: Any, informer: base.Informer) -> list[base.Controller]:
    """DaemonSets, Jobs, CronJobs, ReplicationControllers, and pods that run to completion."""
    return [
        daemonset.DaemonSetController(store, informer),
        job.JobController(store, informer),
        cronjob.CronJobController(store, informer),
        replicationcontroller.ReplicationManager(store, informer),
        completion.Completion(store, informer),
        serviceaccounts.ServiceAccountsController(store, informer),
        clusterroleaggregation.ClusterRoleAggregationController(store, informer),
        resourcequota.ResourceQuotaController(store, informer),
        apiservices.AvailableConditionController(store, informer),
    ]


class Controllers:
    """The running controllers; ``stop()`` stops them and waits for their threads."""

    def __init__(self, store: Any, *, ready_delay_seconds: float = 0.0,
                 termination_seconds: float = 1.0, drainer_on: bool = False,
                 scheduler_on: bool = True, seed: int | None = 0,
                 settings: settings_mod.Settings | None = None) -> None:
        self.store = store
        self.informer = base.Informer(INFORMED)
        self.settings = settings or settings_mod.Settings()
        loss = self.settings.node_loss
        limits = self.settings.controller_manager
        self.controllers: list[base.Controller] = [
            deployment.DeploymentController(store, self.informer, limits=limits),
            replicaset.ReplicaSetController(store, self.informer, limits=limits),
            statefulset.StatefulSetController(store, self.informer, limits=limits),
            pdb.DisruptionController(store, self.informer, limits=limits),
            hpa.HPAController(store, self.informer, limits=limits),
            kubelet.Kubelet(store, self.informer, ready_delay_seconds=ready_delay_seconds,
                            termination_seconds=termination_seconds),
            instances.Reclaimer(store, self.informer, node_loss=loss),
            nodes.NodeLifecycleController(store, self.informer, node_loss=loss, limits=limits),
            tainteviction.TaintEvictionController(store, self.informer, limits=limits),
            instances.CloudNodeLifecycleController(store, self.informer, node_loss=loss, limits=limits),
            podgc.PodGCController(store, self.informer, node_loss=loss, limits=limits),
            *_workload_controllers(store, self.informer),
        ]
        # Karpenter (idle while the cluster has no NodePool) and the cloud's bill
        # (one client, one token bucket, for every Karpenter controller: the provisioner's, shared)
        self.provisioner = provisioner.Provisioner(store, self.informer, capacity=self.settings.capacity, seed=seed,
                                                   limits=self.settings.karpenter)
        self.controllers.append(self.provisioner)
        self.controllers.append(consolidation.Disruption(store, self.informer, capacity=self.settings.capacity,
                                                         owner=self.provisioner))
        # the Cluster Autoscaler (no thread without node groups)
        self.controllers.append(autoscaler.ClusterAutoscaler(store, self.informer, capacity=self.settings.capacity,
                                                             seed=seed, limits=self.settings.cluster_autoscaler))
        self.meter = billing.Meter(store)
        if drainer_on:
            self.controllers.append(drainer.Drainer(store, self.informer))
        self.recorder = events.Recorder(store)
        for c in self.controllers:
            c.recorder = self.recorder
        self.scheduler = scheduling.SchedulerLoop(store, seed=seed) if scheduler_on else None
        if self.scheduler is not None:
            self.scheduler.recorder = self.recorder
        self._stopped = False

    def _dispatch(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if self._stopped:
            return
        self.informer.on_event(event_type, resource, obj)
        if self.scheduler is not None:
            self.scheduler.handle(event_type, resource, obj)
        for c in self.controllers:
            c.handle(event_type, resource, obj)

    def start(self) -> Controllers:
        self.meter.start()
        self.store.subscribe(self._dispatch)
        self.informer.prime(self.store)
        if self.scheduler is not None:
            self.scheduler.prime()
            self.scheduler.start()
        for c in self.controllers:
            c.start()
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.meter.stop()
        unsubscribe = getattr(self.store, "unsubscribe", None)
        if unsubscribe is not None:
            unsubscribe(self._dispatch)
        for c in self.controllers:
            c.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        for c in self.controllers:
            c.join()
        if self.scheduler is not None:
            self.scheduler.join()
        self.recorder.stop()

    def __enter__(self) -> Controllers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_all(store: Any, *, ready_delay_seconds: float = 0.0, termination_seconds: float = 1.0,
              drainer: bool = False, scheduler: bool = True, seed: int | None = 0,
              settings: settings_mod.Settings | None = None) -> Controllers:
    """Start every controller (and the scheduler unless ``scheduler=False``)."""
    return Controllers(
        store, ready_delay_seconds=ready_delay_seconds, termination_seconds=termination_seconds,
        drainer_on=drainer, scheduler_on=scheduler, seed=seed, settings=settings,
    ).start()
