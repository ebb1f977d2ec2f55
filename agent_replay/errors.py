"""The product's exception hierarchy.

It lives in ``traces`` because that is the bottom layer: every other package may import it.
The CLI translates these into one line on stderr and the exit code named here.
"""

from __future__ import annotations


class AgentReplayError(Exception):
    """Base of every error agent-replay raises on purpose."""

    exit_code = 1


class InputError(AgentReplayError):
    """Bad input from the user: arguments, config files, profiles."""

    exit_code = 2


class TraceError(InputError):
    """A trace file is missing, truncated, garbled or violates the schema.

    The message names the file and, where known, the row/line and field.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        row: int | None = None,
        field: str | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        self.path, self.row, self.field = path, row, field
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")


class OutputExistsError(InputError):
    """An output path exists and ``--force`` was not given."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: already exists (use --force to overwrite)")


class TargetError(AgentReplayError):
    """The target server cannot be reached or is not usable."""

    exit_code = 3


class ProtocolError(AgentReplayError):
    """The peer sent something that does not follow the wire protocol."""

    exit_code = 3


class OutputError(AgentReplayError):
    """The results cannot be written (a full disk, no permission). Exit code 5 is also a
    run's code when it ended with finished requests that have no row
    (``RunSummary.exit_code``): either way, what was measured is not all on disk."""

    exit_code = 5


class LaunchError(AgentReplayError):
    """A server we were asked to launch did not come up."""

    exit_code = 4
