"""A pytest plugin (``-p spotguard_client_e2e_plugin``), spotguard's, not upstream's: it
puts the vendored ``kubernetes/`` tree beside this file into the installed client.

The installed ``kubernetes`` package (the pinned wheel) stays the real one; its
``__path__`` gets ``./kubernetes`` appended, and ``kubernetes.aio.__path__`` gets
``./kubernetes/aio``, so ``kubernetes.e2e_test``, ``kubernetes.aio.e2e_test`` and
``kubernetes.aio.utils`` (not in the wheel) come from here while every other module
comes from the wheel, as in upstream's e2e workflow, where the checkout is installed
with ``pip install -e .``. A wheel that one day ships one of them wins (it comes first
on ``__path__``).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes
import kubernetes.aio

TREE = Path(__file__).resolve().parent / "kubernetes"
for package, directory in ((kubernetes, TREE), (kubernetes.aio, TREE / "aio")):
    if str(directory) not in package.__path__:
        package.__path__.append(str(directory))
