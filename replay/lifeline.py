"""Child processes end with their parent, and SIGTERM stops a run the way Ctrl-C does.

* ``die_with_parent(sig)``: the kernel sends ``sig`` to this process when its parent exits
  (Linux ``PR_SET_PDEATHSIG``; elsewhere a thread polls the parent's pid), so a worker or
  scraper never outlives a parent that was killed.
* ``sigterm_as_sigint()``: in the parent, SIGTERM becomes SIGINT (the same graceful stop:
  workers finish what is in flight as ``cancelled``, results and run.json are written),
  also when the process inherited SIGINT ignored;
  ``sigterm_received()`` tells whether it happened, since children, unlike with a Ctrl-C at
  a terminal, did not get the signal themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1
_term = threading.Event()


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
    return os.getppid() == parent


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Within: SIGTERM is handled as SIGINT (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _term.clear()

    def on_term(signum: int, frame: Any) -> None:
        _term.set()
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


def sigterm_received() -> bool:
    return _term.is_set()
