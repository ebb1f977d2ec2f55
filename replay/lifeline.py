"""Child processes end with their parent, and SIGTERM stops a run the way Ctrl-C does.

* ``die_with_parent(sig)``: the kernel sends ``sig`` to this process when its parent exits
  (Linux ``PR_SET_PDEATHSIG``; elsewhere a thread polls the parent's pid), so a worker or
  scraper never outlives a parent that was killed.
* ``sigterm_as_sigint()``: in the parent, SIGTERM becomes SIGINT (the same graceful stop:
  workers finish what is in flight as ``cancelled``, results and run.json are written),
  also when the process inherited SIGINT ignored.
* ``StopSignals``: in a process that runs a shard, SIGINT and SIGTERM (and ``ORPHANED``,
  the parent's death) are one graceful stop, taken once: the first cancels the run (or, before it started, raises
  ``KeyboardInterrupt``), later ones are ignored, so a Ctrl-C at a terminal, the parent's
  own SIGINT after it and a SIGTERM to the group cannot break the stop half-way through
  writing the last rows.
* ``signals_held()``: SIGINT and SIGTERM blocked in this thread while worker processes
  are spawned; the children inherit the block (it survives ``exec``) and take a signal that
  came meanwhile once ``StopSignals`` is installed, so a Ctrl-C during their start-up
  (imports, unpickling) is a clean stop, not a traceback; the parent takes its own when
  the block ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Have ``sig`` delivered to this process when ``parent`` (default: the current
    parent) exits."""
    parent = os.getppid() if parent is None else parent
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if not armed:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the line above took effect
        os.kill(os.getpid(), sig)


def parent_alive(parent: int) -> bool:
    """Whether ``parent`` still runs. A multiprocessing child asks its parent's sentinel
    (a pipe that closes when that process is gone): ``getppid`` can still name a parent
    that was killed while its other threads end."""
    import multiprocessing

    proc = multiprocessing.parent_process()
    if proc is not None and proc.pid == parent:
        return proc.is_alive()
    return os.getppid() == parent


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Within: SIGTERM is handled as SIGINT (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    # A parent without job control (a script's ``cmd &``, a test runner's worker) may have
    # left SIGINT ignored, which the process inherits: SIGINT, and SIGTERM through it,
    # would then do nothing. Within, both stop the run.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


_STOPS = (signal.SIGINT, signal.SIGTERM)
ORPHANED = signal.SIGUSR1
"""The signal a worker asks for at its parent's death (``die_with_parent``): a stop that
also says nobody reads its messages any more. ``getppid`` and the parent's sentinel can
still show a parent killed outright as alive for a while, until all its threads ended."""


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held within: blocked in this thread (processes started within
    inherit the block), and, since the kernel may hand a signal for the process to another
    thread, kept from this process's own handlers too; one that came is raised again when
    the block ends."""
    came: list[int] = []
    old_handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _STOPS:
            old_handlers[sig] = signal.signal(sig, lambda signum, frame: came.append(signum))
    old_mask = (
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        if hasattr(signal, "pthread_sigmask")
        else None
    )
    try:
        yield
    finally:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for num, handler in old_handlers.items():
            signal.signal(num, handler)
        for num in dict.fromkeys(came):
            signal.raise_signal(num)


class StopSignals:
    """SIGINT, SIGTERM and ``ORPHANED`` as one graceful stop of a shard's run, taken once
    (see the module docs); ``orphaned`` tells that the parent died. ``arm(cancel)`` when the run starts: a stop then calls ``cancel`` (thread-safe:
    it is called from the signal handler); before that, a stop raises ``KeyboardInterrupt``.
    ``install`` also unblocks the two signals (``signals_held``), so one that came during
    the process's start is taken now. Main thread only; elsewhere a no-op."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None
        self.orphaned = False  # ORPHANED came: the parent is gone (die_with_parent)
        self._cancel: Callable[[], None] | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (*_STOPS, ORPHANED):
            self._old[sig] = signal.signal(sig, self._on_signal)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        return self

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def arm(self, cancel: Callable[[], None] | None) -> None:
        """From now on a stop calls ``cancel`` (None: raise ``KeyboardInterrupt`` again);
        a stop that came before is passed on at once."""
        self._cancel = cancel
        if cancel is not None and self.requested:
            cancel()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == ORPHANED:
            self.orphaned = True
        if self.requested:
            return
        self.requested = True
        self.signal = signum
        if self._cancel is not None:
            self._cancel()
        else:
            raise KeyboardInterrupt
