"""``--ray=local``: a private one-node Ray, started and ended by a keeper process of its
own, so that the run's shards outlive a run's process killed outright long enough to
write their rows.

Ray's processes (GCS, raylet) die at once with the process that started them (Ray arms
``PR_SET_PDEATHSIG`` on them), and the actors with their raylet, before they can write
what they hold. Here the keeper starts them: a child of the run's process in a session of
its own (a Ctrl-C at the terminal or a signal to the run's group does not reach Ray; the
run's process stops its actors itself), that the run's process connects to. The keeper
ends Ray when the run's process closes it or, once that process is gone, after the run's
actors (detached: they are not killed with their driver; ``actor.ShardActor`` watches
the driver) stopped, wrote their rows and run.json and ended, or after ``ORPHAN_WAIT_S``.
Nothing of it outlives the run.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

from agent_replay.errors import AgentReplayError, TargetError
from agent_replay.replay.lifeline import ORPHANED, die_with_parent, parent_alive, signals_held

OBJECT_STORE_BYTES = 256 * 1024 * 1024
"""The private Ray's object store: on one node the actors write their part files in place
and hand the driver only progress and live snapshots (small); more spills to disk."""

ORPHAN_WAIT_S = 60.0
"""Once the run's process is gone, how long the actors get to stop, write their rows and
end before Ray is ended under them, beyond the time their part files may be retried
(``pools.STOP_WAIT_S`` fits in it)."""

START_S = 120.0
AUTH_MODE = "RAY_AUTH_MODE"
"""Ray turns token authentication on in the process that starts a cluster (its token in
~/.ray); a process that connects to it by address must turn it on too."""
NAMESPACE = "agent-replay"


class LocalRay:
    """The keeper process of a private one-node Ray; ``address`` is its GCS address."""

    def __init__(self, proc: Any, conn: Any, address: str) -> None:
        self.proc, self.conn, self.address = proc, conn, address
        self.auth_mode: str | None = None  # Ray's RAY_AUTH_MODE there (``token``: ~/.ray's token)

    @classmethod
    def start(cls, orphan_wait_s: float = ORPHAN_WAIT_S) -> LocalRay:
        """Start the keeper and its Ray; ``orphan_wait_s``: how long Ray is kept for the
        actors once the run's process is gone."""
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=_keeper_main,
            args=(theirs, OBJECT_STORE_BYTES, orphan_wait_s),
            name="agent-replay-ray",
            daemon=False,
        )
        keeper = cls(proc, ours, "")
        deadline = time.monotonic() + START_S
        try:
            with signals_held():  # its handlers are in place before a stop can reach it
                proc.start()
            theirs.close()
            while not ours.poll(0.2):
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise TargetError(
                        "--ray local: the private Ray did not start"
                        + (
                            ""
                            if proc.is_alive()
                            else f" (its process exited with code {proc.exitcode})"
                        )
                    )
            kind, payload = ours.recv()
        except BaseException:
            keeper.close()
            raise
        if kind != "ready":
            keeper.close()
            raise TargetError(f"--ray local: cannot start a private Ray: {payload}")
        keeper.address, keeper.auth_mode = payload
        return keeper

    def close(self, timeout_s: float = 60.0) -> None:
        """End Ray and the keeper (it ends Ray's processes itself); killed if it does
        not end within ``timeout_s``."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("close", None))
        if self.proc.pid is None:  # never started
            return
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.terminate()  # Ray's own SIGTERM handler there ends its processes
            self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        with contextlib.suppress(OSError):
            self.conn.close()


def _keeper_main(conn: Any, object_store_bytes: int, orphan_wait_s: float) -> None:
    parent = os.getppid()
    with contextlib.suppress(OSError):
        os.setsid()  # out of the run's process group and terminal
    gone = threading.Event()
    signal.signal(ORPHANED, lambda signum, frame: gone.set())
    for sig in (signal.SIGINT, signal.SIGTERM):  # the run's process ends it, by message
        signal.signal(sig, lambda signum, frame: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    die_with_parent(ORPHANED, parent)
    import ray

    try:
        ctx = ray.init(
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=object_store_bytes,
            log_to_driver=False,
            namespace=NAMESPACE,
        )
        port = str(ctx.address_info["gcs_address"]).rsplit(":", 1)[1]  # type: ignore[attr-defined]
        ready = (f"127.0.0.1:{port}", os.environ.get(AUTH_MODE))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", first))
        return
    try:
        with contextlib.suppress(OSError, ValueError):  # the run's process is gone already
            conn.send(("ready", ready))
        while not gone.is_set() and parent_alive(parent):
            try:
                if conn.poll(0.2) and conn.recv()[0] == "close":
                    return
            except (EOFError, OSError):
                break
        _wait_actors(ray, time.monotonic() + orphan_wait_s)
    finally:
        ray.shutdown()


def _wait_actors(ray: Any, deadline: float) -> None:
    """Until no named actor of this private cluster is alive (the run's shards end on
    their own once the run's process is gone), or ``deadline``."""
    while time.monotonic() < deadline:
        try:
            if not ray.util.list_named_actors(all_namespaces=True):
                return
        except Exception:  # Ray itself is failing: nothing left to wait for
            return
        time.sleep(0.2)


def connect_local(ray: Any, write_retry_s: float = 0.0, **kwargs: Any) -> LocalRay:
    """Start a private one-node Ray and connect this process to it; ``write_retry_s``:
    how long the actors may retry a part file (``RunConfig.write_retry_s``)."""
    keeper = LocalRay.start(ORPHAN_WAIT_S + write_retry_s)
    if keeper.auth_mode is not None and os.environ.get(AUTH_MODE) != keeper.auth_mode:
        os.environ[AUTH_MODE] = keeper.auth_mode
        with contextlib.suppress(ImportError, AttributeError):  # Ray reads it once, at import
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")
    try:
        ray.init(address=keeper.address, **kwargs)
    except Exception as exc:
        keeper.close()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AgentReplayError(f"--ray local: cannot connect to the private Ray: {first}") from None
    return keeper
