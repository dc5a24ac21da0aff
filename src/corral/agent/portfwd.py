"""Ports of sandboxed jobs: the agent listens on a free port of the host's loopback for each of a job's
``ports`` and relays every connection to that port at the job's address, inside its namespace.

So two jobs that listen on the same port never collide, and a job never collides with the CLI's local
forwards of the same port numbers: ``job_runtime_data.ports`` maps each of the job's ports to its host
port here, as Docker's published ports do. Threads only (standard library): one that accepts per port,
two that copy per connection.
"""

from __future__ import annotations

import socket
import threading

_CHUNK = 65536


class Forwarder:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen_host, 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        t = threading.Thread(target=self._accept, name=f"fwd-{target_host}:{target_port}")
        t.daemon = True
        t.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._relay, args=(client,), name="fwd-conn")
            t.daemon = True
            t.start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            if self._closed.is_set():
                client.close()
                upstream.close()
                return
            self._conns.update((client, upstream))
        t = threading.Thread(target=_copy, args=(upstream, client), name="fwd-down")
        t.daemon = True
        t.start()
        _copy(client, upstream)
        t.join()
        with self._lock:
            self._conns.discard(client)
            self._conns.discard(upstream)
        client.close()
        upstream.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
