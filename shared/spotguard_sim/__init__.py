"""A simulated Kubernetes cluster: an API server on loopback, its store and controllers.

``from spotguard_sim import testing`` and ``testing.running_cluster()`` for tests;
``spotguard sim serve`` from the command line.
"""
