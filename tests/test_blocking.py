"""`rltldr_jax.blocking.run`: a coroutine run to completion from synchronous code, also where the calling thread
runs an event loop (a Jupyter kernel), where `asyncio.run` refuses; its exceptions reach the caller."""

import asyncio
import threading

import pytest

from rltldr_jax import blocking


async def _where() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def _fails() -> None:
    raise KeyError("from the coroutine")


def test_without_a_running_loop_it_is_asyncio_run_on_this_thread():
    assert blocking.run(_where()) == threading.current_thread().name
    with pytest.raises(KeyError, match="from the coroutine"):
        blocking.run(_fails())


def test_under_a_running_loop_it_runs_on_a_thread_of_its_own():
    async def cell():  # synchronous code called inside a running loop, as a notebook cell is
        with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
            coro = _where()
            try:
                asyncio.run(coro)
            finally:
                coro.close()
        with pytest.raises(KeyError, match="from the coroutine"):
            blocking.run(_fails())
        return blocking.run(_where())

    assert asyncio.run(cell()).startswith("rltldr-blocking")
