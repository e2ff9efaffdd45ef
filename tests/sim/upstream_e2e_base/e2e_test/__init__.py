"""Stands in for ``kubernetes.e2e_test`` (not shipped in the wheel): only ``base``."""
