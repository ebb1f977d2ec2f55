"""``--http-client``: the option reaches the workers, run.json records the client used, and a
run against the simulated engine gives the same rows with either client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.engines.sim import SimProcess
from agent_replay.errors import InputError
from agent_replay.replay.cli import build_parser
from agent_replay.replay.cli.cmd_run import config_from_args
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import run
from tests.replay.helpers import MS, chain_rows, write_rows


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess("fast") as s:
        yield s


def test_cli_option_and_config_checks() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "t.parquet", "--target", "http://127.0.0.1:1"])
    assert config_from_args(args, args.target).http_client == "fast"
    args = parser.parse_args(
        ["run", "t.parquet", "--target", "http://127.0.0.1:1", "--http-client", "aiohttp"]
    )
    assert config_from_args(args, args.target).http_client == "aiohttp"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "t.parquet", "--target", "http://x", "--http-client", "curl"])
    with pytest.raises(InputError, match="--http-client"):
        RunConfig(trace="t", target="http://x", http_client="curl").check()
    assert RunConfig(trace="t", target="https://x").effective_http_client() == "aiohttp"
    assert RunConfig(trace="t", target="http://x").effective_http_client() == "fast"
    assert (
        RunConfig(trace="t", target="http://x", http_client="aiohttp").effective_http_client()
        == "aiohttp"
    )


def test_both_clients_give_the_same_rows(sim: SimProcess, tmp_path: Path) -> None:
    rows = chain_rows(6, 3, gap_ns=20 * MS, think_ns=10 * MS, input_tokens=120, output_tokens=10)
    trace = write_rows(tmp_path / "t.parquet", rows)
    got = {}
    for client in ("fast", "aiohttp"):
        out = tmp_path / client
        s = run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(out),
                salt=7,
                speedup=4,
                scrape_interval_s=0,
                http_client=client,
            ),
            progress=None,
        )
        assert (s.ok, s.failed, s.mismatches, s.total) == (18, 0, 0, 18)
        meta = read_run_record(out)
        assert meta.environment["http_client"] == client
        assert meta.option("http_client") == client
        t = pq.read_table(out / "requests").sort_by(
            [("session_id", "ascending"), ("request_index", "ascending")]
        )
        got[client] = t.select(
            [
                "session_id",
                "request_index",
                "status",
                "error_kind",
                "http_status",
                "prompt_tokens",
                "completion_tokens",
                "expected_output_tokens",
                "chunk_tokens",
            ]
        ).to_pydict()
        d = t.to_pydict()
        assert all(len(c) == 10 + r for c, r in zip(d["chunk_ns"], d["request_index"], strict=True))
        assert all(
            s_ < h <= f <= e
            for s_, h, f, e in zip(
                d["sent_ns"], d["headers_ns"], d["first_token_ns"], d["end_ns"], strict=True
            )
        )
    assert got["fast"] == got["aiohttp"]
