"""A run whose first requests all fail with one client error stops early and says the
server's message in one line (``replay.failfast``).

Before: ``--model nosuch`` played the whole schedule (57 requests) and ended with
"failures: http 57", the server's "model does not exist" only in the Parquet. After:
"error: the first 8 requests all failed with HTTP 404: The model `nosuch` does not exist."
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent_replay.replay.failfast import FIRST, FirstFailures, server_message

OPENAI_404 = (
    'HTTP 404: {"object": "error", "message": "The model `nosuch` does not exist.", '
    '"type": "NotFoundError", "param": "model", "code": 404}'
)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (OPENAI_404, "The model `nosuch` does not exist."),
        (
            'HTTP 401: {"error": {"message": "Incorrect API key provided",\n "type": "auth"}}',
            "Incorrect API key provided",
        ),
        (
            'HTTP 400: {"type": "error", "error": {"type": "invalid_request_error", '
            '"message": "max_tokens: Field required"}}',
            "max_tokens: Field required",
        ),
        ('HTTP 422: {"detail": [{"msg": "field required"}]}', "field required"),
        ("HTTP 403: Forbidden\n<html>", "Forbidden <html>"),
        (None, ""),
    ],
)
def test_server_message_is_one_line(error: str | None, said: str) -> None:
    assert server_message(error) == said


def test_stops_on_the_first_alike_failures_only() -> None:
    f = FirstFailures(first=3)
    assert f.observe(False, False, 404, OPENAI_404) is None
    assert f.observe(False, True, None, "cancelled") is None  # the run's own stop: ignored
    assert f.observe(False, False, 404, OPENAI_404) is None
    assert f.observe(False, False, 404, OPENAI_404) == (
        "the first 3 requests all failed with HTTP 404: The model `nosuch` does not exist."
    )
    assert f.observe(False, False, 404, OPENAI_404) is None  # said once


@pytest.mark.parametrize(
    "outcomes",
    [
        [(True, None, None)],  # a success: the target works
        [(False, 429, "HTTP 429: slow down")],  # load-dependent
        [(False, 500, "HTTP 500: boom")],  # a server error is not a request error
        [
            (False, 400, "HTTP 400: prompt 9000 > 8192"),
            (False, 400, "HTTP 400: prompt 9100 > 8192"),
        ],
    ],
)
def test_does_not_stop_on_mixed_or_load_dependent_failures(
    outcomes: list[tuple[bool, int | None, str | None]],
) -> None:
    f = FirstFailures(first=2)
    got = [f.observe(ok, False, status, err) for ok, status, err in outcomes]
    got += [f.observe(False, False, 404, OPENAI_404) for _ in range(4)]
    assert got == [None] * len(got)


def test_unknown_model_run_stops_early_with_the_message(tmp_path: Path) -> None:
    from agent_replay.engines.sim import SimProcess
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import run
    from agent_replay.replay.summary import render_summary
    from tests.replay.helpers import MS, chain_rows, write_rows

    trace = write_rows(tmp_path / "t.parquet", chain_rows(20, 3, gap_ns=20 * MS, think_ns=5 * MS))
    with SimProcess("fast") as sim:
        s = run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(tmp_path / "r"),
                model="nosuch",
                scrape_interval_s=0,
                gpu_metrics="off",
                salt=0,
                speedup=2,
            ),
            progress=None,
        )
    assert s.status == "aborted" and s.exit_code == 1
    assert FIRST <= s.failed < s.total == 60
    buf = io.StringIO()
    render_summary(s, buf)
    first = buf.getvalue().splitlines()[0]
    assert first == (
        "error: the first 8 requests all failed with HTTP 404: The model `nosuch` does not exist."
    )
    state = next(x for x in buf.getvalue().splitlines() if x.startswith("ABORTED"))
    assert f"{s.total - s.sent} not sent (stopped), 0 not sent (past --duration)" in state
    from agent_replay.analysis.results import read_run_record

    assert read_run_record(tmp_path / "r").extra["abort_reason"] == first.removeprefix("error: ")
