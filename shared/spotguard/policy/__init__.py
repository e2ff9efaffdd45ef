"""The spotguard policy: pure functions and small types, no I/O.

Nothing in this package may import a network client, the Kubernetes client,
boto3, Flask or cloudevents; ``tests/test_policy_purity.py`` enforces it.
Adapters (``spotguard.gateway``, the functions) do the I/O and hand the policy
plain data.
"""
