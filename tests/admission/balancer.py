"""A round-robin TCP load balancer on loopback: each new connection goes to the next backend.

TLS passes through untouched (the backends share one serving certificate), as
a Kubernetes Service in front of several webhook pods would spread
kube-apiserver's connections.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections import Counter


class Balancer:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self._next = itertools.cycle(range(len(backends)))
        self.connections: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                index = next(self._next)
                self.connections[index] += 1
            threading.Thread(target=self._serve, args=(client, self.backends[index]), daemon=True).start()

    def _serve(self, client: socket.socket, backend: tuple[str, int]) -> None:
        try:
            upstream = socket.create_connection(backend, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def close(self) -> None:
        self._stop = True
        self.listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
