"""The ``agent-replay`` command line: parse, call the library, render.

Each command group lives in its own module with a ``register(subparsers)`` function that
adds its parsers and sets ``func`` (taking the parsed ``argparse.Namespace`` and returning
an exit code). Errors from the library (``AgentReplayError``) become one line on stderr
and the exit code the error class names.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from agent_replay import __version__
from agent_replay.errors import AgentReplayError


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose error is one line that points to ``--help`` (argparse's
    own prints the whole usage first, 35 lines for ``run``, above the line that matters)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from agent_replay.replay.cli import (
        cmd_analysis,
        cmd_engines,
        cmd_record,
        cmd_record_otlp,
        cmd_run,
        cmd_sweep,
        cmd_traces,
    )

    parser = Parser(
        prog="agent-replay",
        description="Record coding-agent sessions and replay them against LLM serving "
        "deployments with their original timing.",
    )
    parser.add_argument("--version", action="version", version=f"agent-replay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    cmd_run.register(sub)
    cmd_record.register(sub)
    cmd_record_otlp.register(sub)
    cmd_analysis.register(sub)
    cmd_traces.register(sub)
    cmd_engines.register(sub)
    cmd_sweep.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports the commands: a Ctrl-C may come meanwhile
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        return int(func(args) or 0)
    except AgentReplayError as exc:
        from agent_replay.safetext import visible

        print(f"agent-replay: error: {visible(exc)}", file=sys.stderr)  # names in it are data
        return exc.exit_code
    except KeyboardInterrupt:
        print("agent-replay: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry() -> NoReturn:
    """The ``agent-replay`` executable: ``main()``, then :func:`exit_process`. SIGINT stops
    it even when it was started with SIGINT ignored (a script's ``cmd &``)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before a command took it over (importing, parsing)
        print("agent-replay: interrupted", file=sys.stderr)
        code = 130
    exit_process(code)


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: Python's own shutdown steps (non-daemon threads joined,
    ``atexit`` handlers, multiprocessing children reaped, streams flushed), then ``os._exit``.

    What is skipped is the native teardown after them: the C++ static destructors of
    Arrow's thread pools can race a pool worker at exit and abort a process whose work is
    complete ("terminate called without an active exception", exit -6; apache/arrow#34314,
    #39862). A command's exit code must say how its work went, not how a library's threads
    were torn down; a library's exit hook that raises is one line on stderr, not a
    traceback and exit 1 (CPython 3.11's ``concurrent.futures`` hook can write to a
    process pool's wake-up pipe that the pool's own thread is closing: EBADF).
    """
    shutdown_threads = getattr(threading, "_shutdown", None)
    try:
        if shutdown_threads is not None:
            try:
                shutdown_threads()
            except Exception as exc:  # a library's exit hook, after the command's work
                with contextlib.suppress(OSError, ValueError):
                    print(f"agent-replay: at exit: {type(exc).__name__}: {exc}", file=sys.stderr)
        atexit._run_exitfuncs()
    except KeyboardInterrupt:  # Ctrl-C while the work is done and the process ends
        code = code or 130
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe reads as done
                stream.flush()
    os._exit(code)
