"""The Kubernetes gateway: the only place spotguard talks to the Kubernetes API.

``from spotguard.gateway import kube, resources`` then ``kube.connect()``.
"""
