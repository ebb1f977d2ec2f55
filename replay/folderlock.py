"""One writer per results folder.

A run takes an exclusive ``flock`` on ``RESULTS/.writer.lock`` before it decides anything
about the folder, and holds it to its end; its worker processes share that lock (the open
file is handed to them, so it lives on while any of them runs, also after the run's
process was killed). The file holds the writer's identity (``runmeta.writer_identity``,
as run.json's ``writer``). A second run into the folder cannot take the lock and refuses in
one line, with or without ``--force``. The kernel drops the lock of a process that died, so
a dead writer never blocks; where ``flock`` is not supported the identity decides: a
writer on this host that is gone is stale and its lock is taken over.

``--force`` on a folder with no live writer moves its contents aside to a sibling folder
(``RESULTS.replaced-STAMP``) and never deletes them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError, OutputError, OutputExistsError
from agent_replay.runmeta import process_state, writer_identity

LOCK_NAME = ".writer.lock"
_HELD: dict[Path, FolderLock] = {}


class FolderLock:
    """The lock on one results folder, held by this process (``acquire``); ``moved_to``:
    where ``--force`` moved the folder's earlier contents (None: it was new or empty)."""

    def __init__(
        self, folder: Path, fd: int, moved_to: Path | None, stale: dict[str, Any] | None
    ) -> None:
        self.folder = folder
        self.fd: int | None = fd
        self.moved_to = moved_to
        self.stale = stale  # the identity of a dead writer whose lock was taken over

    def share(self) -> Shared | None:
        """The lock, to pass among a worker process's start arguments: it then holds it too."""
        return None if self.fd is None else Shared(self.fd)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        _HELD.pop(self.folder, None)


def held(folder: Path) -> FolderLock | None:
    """The lock this process holds on ``folder``, if any."""
    return _HELD.get(Path(folder).absolute())


def _refuse(folder: Path, who: dict[str, Any]) -> InputError:
    pid, host = who.get("pid"), who.get("host")
    by = f"pid {pid} on {host}" if pid else "another process"
    started = who.get("started")
    return InputError(
        f"{folder}: another run is writing its results here ({by}"
        f"{f', since {started}' if started else ''}); choose another --output "
        "(--force does not take the folder of a live run)"
    )


def _identity(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 65536, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _try_lock(fd: int) -> bool | None:
    """True: locked; False: another holds it; None: this file system has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise


def _aside(folder: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = folder.with_name(f"{folder.name}.replaced-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = folder.with_name(f"{folder.name}.replaced-{stamp}-{n}")
    return dest


def refuse_if_busy(folder: Path) -> None:
    """Refuse at once (before the trace is read) a folder that a live run holds; ``acquire``
    decides for good later."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or no folder): nobody holds it
    try:
        if _try_lock(fd) is False:
            raise _refuse(folder, _identity(fd))
    finally:
        os.close(fd)  # drops the lock this took, if it took one


def acquire(folder: Path, force: bool) -> FolderLock:
    """Make ``folder`` a fresh results folder (with ``requests/``) held by this process.
    Refuses (``InputError``, one line) a folder another run is writing, with or without
    ``force``; a non-empty folder without ``force`` (``OutputExistsError``) or one that is
    not a results folder. With ``force`` the earlier contents move aside (``moved_to``)."""
    given, folder = folder, Path(folder).absolute()
    if folder.exists() and not folder.is_dir():
        if not force:
            raise OutputExistsError(str(given))
        raise InputError(f"{given}: exists and is not a results folder; remove it yourself")
    moved_to: Path | None = None
    stale: dict[str, Any] | None = None
    for _ in range(5):  # a folder moved aside by a racing run is looked at again
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        made = not (folder / LOCK_NAME).exists()
        fd = _open_lock(given, folder)
        if fd is None:
            continue  # moved aside meanwhile
        try:
            stale = _stale_writer(given, fd) or stale
            if not _same_lock(fd, folder):  # another run moved the folder aside under us
                os.close(fd)
                continue
            if _leftovers(folder):
                moved_to = _set_aside(given, folder, force, made)  # with our lock file in it
                os.close(fd)
                continue
            _claim(given, folder, fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        lock = FolderLock(folder, fd, moved_to, stale)
        _HELD[folder] = lock
        return lock
    raise InputError(f"{given}: other runs keep moving this folder; choose another --output")


def _open_lock(given: Path, folder: Path) -> int | None:
    """The folder's lock file, opened (made if need be); None when the folder was moved
    aside meanwhile."""
    try:
        return os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{given}: cannot write the results: {exc.strerror or exc}") from None


def _stale_writer(given: Path, fd: int) -> dict[str, Any] | None:
    """Refuse a folder a live run holds; the recorded writer when it is gone (where there
    is no flock, the recorded writer decides), else None."""
    got = _try_lock(fd)
    who = _identity(fd)
    if got is False:
        raise _refuse(given, who)
    if got is None and who:  # no flock here: the recorded writer decides
        if process_state(who) != "gone":
            raise _refuse(given, who)
        return who
    return None


def _same_lock(fd: int, folder: Path) -> bool:
    """Whether ``fd`` is still the lock file in ``folder`` (not moved aside by another run)."""
    try:
        return os.fstat(fd).st_ino == (folder / LOCK_NAME).stat().st_ino
    except FileNotFoundError:
        return False


def _leftovers(folder: Path) -> list[Path]:
    """What the folder holds besides the lock file and an empty ``requests/``."""
    return [
        e
        for e in folder.iterdir()
        if e.name != LOCK_NAME
        and not (e.name == "requests" and e.is_dir() and not any(e.iterdir()))
    ]


def _set_aside(given: Path, folder: Path, force: bool, made: bool) -> Path:
    """Move an earlier results folder aside (``force``), where it went; anything else is
    refused, and a lock file made for it removed."""
    results = (folder / "run.json").exists() or (folder / "requests").is_dir()
    if not (force and results):
        if made:  # leave the folder as it was
            with contextlib.suppress(OSError):
                (folder / LOCK_NAME).unlink()
        if not force:
            raise OutputExistsError(str(given))
        raise InputError(
            f"{given}: not a results folder (no run.json); refusing to "
            "overwrite it even with --force"
        )
    moved_to = _aside(folder)
    os.rename(folder, moved_to)  # with our lock file in it: held until now
    return moved_to


def _claim(given: Path, folder: Path, fd: int) -> None:
    """Record this process as the folder's writer and make ``requests/``."""
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**writer_identity(), "started": started}).encode(), 0)
        (folder / "requests").mkdir(exist_ok=True)
    except OSError as exc:  # a full disk before the start: one line, exit 5
        raise OutputError(f"{given}: cannot write the results: {exc.strerror or exc}") from None


class Shared:
    """The lock handed to a worker process: pickled while ``multiprocessing`` starts the
    process, its file descriptor goes with it (``reduction.DupFd``), and the worker holds
    the lock until it exits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        from multiprocessing import reduction

        return _rebuild, (reduction.DupFd(self.fd),)


def _rebuild(dup: Any) -> Shared:
    return Shared(dup.detach())
