"""The wire cost of bench/run.py (PostgreSQL only): a counting proxy in front of the server
tells how many sync points (ReadyForQuery messages: the client waits for each) and COMMITs
one enqueue, one claim and one step append cost. Run by `python bench/run.py` (skip it with
`--no-wire`).
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit, urlunsplit

from run import AGENT, REQUEST, step_payload, steptrail_settings

from steptrail.runtime import open_runtime
from steptrail.workers.holders import holder_name

WIRE_APPENDS = 20
WIRE_OPS = 20  # enqueues and claims counted
WIRE_WARM_UP = 8  # 2 x the pool's connections: each prepares its statements once


class WireCounter:
    """A loopback TCP proxy that counts, in what the server sends, ReadyForQuery messages
    (one per sync point: each is a round trip the client waits for) and COMMIT command tags.

    It relies on the session starting without SSL/GSS negotiation (PGSSLMODE=disable), so
    that the server's stream is framed protocol messages from its first byte.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.syncs = 0
        self.commits = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.syncs, self.commits

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()
            threading.Thread(target=self._count, args=(server, client), daemon=True).start()

    @staticmethod
    def _forward(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            target.close()

    def _count(self, server: socket.socket, client: socket.socket) -> None:
        buffer = b""
        try:
            while data := server.recv(65536):
                buffer += data
                while len(buffer) >= 5:
                    size = int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < 1 + size:
                        break
                    kind, body, buffer = buffer[:1], buffer[5 : 1 + size], buffer[1 + size :]
                    with self._lock:
                        if kind == b"Z":
                            self.syncs += 1
                        elif kind == b"C" and body.rstrip(b"\0") == b"COMMIT":
                            self.commits += 1
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()


def wire_costs(url: str) -> dict[str, float]:
    """Round trips (sync points) and COMMITs per enqueue, claim and step append."""
    parts = urlsplit(url)
    counter = WireCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{counter.port}"
    proxied = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    costs: dict[str, float] = {}
    try:
        with open_runtime(settings=steptrail_settings(proxied)) as runtime:
            # Warm-up: the pool hands its connections out in turn, and psycopg prepares a
            # statement on its first use on each connection (one extra round trip, once per
            # connection), so every pooled connection runs each statement once first; what
            # is counted is the steady state, averaged over WIRE_OPS operations.
            holder, lease_ms = holder_name("bench"), runtime.settings.lease_ms
            for _ in range(WIRE_WARM_UP):
                runtime.enqueue(AGENT, REQUEST)
            before = counter.snapshot()
            for _ in range(WIRE_OPS):
                runtime.enqueue(AGENT, REQUEST)
            costs.update(_per_op("enqueue", before, counter.snapshot(), WIRE_OPS))
            for _ in range(WIRE_WARM_UP):  # the key's run is queued too (claimed below)
                runtime.enqueue(AGENT, REQUEST, idempotency_key="wire-taken")
            before = counter.snapshot()
            for _ in range(WIRE_OPS):
                runtime.enqueue(AGENT, REQUEST, idempotency_key="wire-taken")
            costs.update(_per_op("enqueue_key_taken", before, counter.snapshot(), WIRE_OPS))
            claimed = None
            for _ in range(WIRE_WARM_UP):  # every run enqueued above is claimed in turn
                runtime.store.claim(holder=holder, lease_ms=lease_ms, agents=[AGENT])
            before = counter.snapshot()
            for _ in range(WIRE_OPS):
                claimed = runtime.store.claim(holder=holder, lease_ms=lease_ms, agents=[AGENT])
            costs.update(_per_op("claim", before, counter.snapshot(), WIRE_OPS))
            assert claimed is not None
            run = claimed.run
            for i in range(WIRE_WARM_UP):
                run.record_step(kind="llm", name=f"w{i}", duration_ms=0, payload=step_payload(0))
                runtime.store.append(run)
            before = counter.snapshot()
            for i in range(1, WIRE_APPENDS + 1):
                run.record_step(kind="llm", name=f"s{i}", duration_ms=0, payload=step_payload(i))
                runtime.store.append(run)
            costs.update(_per_op("append", before, counter.snapshot(), WIRE_APPENDS))
    finally:
        counter.close()
    return costs


def _per_op(name: str, before: tuple[int, int], after: tuple[int, int], n: int) -> dict[str, float]:
    return {
        f"{name}_round_trips": (after[0] - before[0]) / n,
        f"{name}_commits": (after[1] - before[1]) / n,
    }
