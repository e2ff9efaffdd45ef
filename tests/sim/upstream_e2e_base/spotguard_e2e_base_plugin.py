"""A pytest plugin (``-p spotguard_e2e_base_plugin``) that provides ``kubernetes.e2e_test``.

The installed ``kubernetes`` package stays the real one; its ``__path__`` gets
this directory appended, so ``from kubernetes.e2e_test import base`` finds
``e2e_test/base.py`` here while every other ``kubernetes.*`` module still comes
from the wheel. A wheel that one day ships its own ``e2e_test`` wins (it comes
first on ``__path__``).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes

HERE = str(Path(__file__).resolve().parent)
if HERE not in kubernetes.__path__:
    kubernetes.__path__.append(HERE)
