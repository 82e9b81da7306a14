"""Running a coroutine to completion from synchronous code, wherever that code runs.

    result = blocking.run(collector.collect_async(tasks, phase))

`asyncio.run` refuses to start when the calling thread already runs an event loop, which is the case in every
Jupyter and Colab kernel (ipykernel runs the cells inside its loop): there `run` runs the coroutine on a thread of
its own with a fresh loop and waits for it; elsewhere it is `asyncio.run`. Either way the coroutine gets a loop of
its own, so what it creates (locks, queues, tasks) never mixes with the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`'s result (or its exception), on a fresh event loop; on another thread when this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here: the usual case (scripts, launchers, tests)
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rltldr-blocking") as pool:
        return pool.submit(asyncio.run, coro).result()
