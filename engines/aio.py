"""One way to run a coroutine on a fresh event loop: uvloop when asked for and installed
(it is a dependency off Windows), else asyncio. Every process entry point (replay
workers, the Ray actor, the recorder, the simulated engine) uses this, so "which loop"
is decided in one place."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOP_KINDS = ("uvloop", "asyncio")


def _check(kind: str) -> None:
    if kind not in LOOP_KINDS:
        raise ValueError(f"unknown event loop kind {kind!r} (one of {', '.join(LOOP_KINDS)})")


def new_event_loop(kind: str = "uvloop") -> asyncio.AbstractEventLoop:
    """A fresh loop of ``kind`` (``uvloop`` falls back to asyncio where it is missing)."""
    _check(kind)
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(
    main: Coroutine[Any, Any, T],
    kind: str = "uvloop",
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """``asyncio.run(main)`` on a fresh loop of ``kind`` (or from ``loop_factory``): Ctrl-C
    cancels ``main`` (Python 3.11+), tasks left running are cancelled, the loop is closed."""
    if loop_factory is None:
        _check(kind)  # before anything runs
        loop_factory = functools.partial(new_event_loop, kind)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main)
    loop = loop_factory()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
