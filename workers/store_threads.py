"""The threads that make store calls for async runs, so that no store call blocks the loop.

The stores are synchronous (psycopg's pool on PostgreSQL, sqlite3 on SQLite) and shared
with the threaded side of a worker. An async run hands every call that touches the store or
the segment's lock to this small dedicated pool and awaits the result; its agent's own
awaits (model calls, tools, sleeps) stay on the event loop. One pool per worker bounds how
many store calls are in flight at once, whatever the number of runs (ADR 0023).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_STORE_THREADS = 8


class StoreThreads:
    """A lazily started pool of `size` threads that runs store calls for coroutines."""

    def __init__(self, size: int = DEFAULT_STORE_THREADS) -> None:
        if size < 1:
            raise ValueError("the store thread pool needs at least one thread")
        self.size = size
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a store thread, awaited. Its exceptions (LeaseLost,
        Suspend, StoreUnavailable, …) are raised here, in the coroutine.

        If the awaiting task is cancelled, the call still finishes on its thread: an append
        is never abandoned half-way; its outcome is simply not awaited.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait for calls in flight, then stop the threads (a later call starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="steptrail-store")
            return self._pool
