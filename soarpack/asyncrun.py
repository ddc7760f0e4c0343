"""Run a coroutine to its end from synchronous code, also where an event loop already runs in this thread (a
notebook cell): there `asyncio.run` refuses, so the coroutine gets its own loop in a worker thread, waited on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


def _loop_is_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_to_end(make: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(make())`, in a worker thread when this thread's loop is busy; its exception is re-raised here."""
    if not _loop_is_running():
        return asyncio.run(make())  # type: ignore[arg-type]
    outcome: dict = {}

    def worker() -> None:
        try:
            outcome["value"] = asyncio.run(make())  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome["error"] = exc

    thread = threading.Thread(target=worker, name="soarpack-run", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    value: Any = outcome["value"]
    return value
