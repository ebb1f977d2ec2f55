"""The benchmark's floor client (benchmarks/peers/floor.py) against the simulated engine:
every request is answered and every chunk is read, with each stamp kind."""

from __future__ import annotations

import argparse
import dataclasses

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProfile
from agent_replay.engines.sim.server import SimServer
from benchmarks.peers import floor
from benchmarks.peers.harness import MODEL


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_floor_reads_every_request_to_its_end(tmp_path, stamps):
    gt = tmp_path / "gt.parquet"
    profile = dataclasses.replace(SimProfile.load("fast"), model_name=MODEL)
    async with SimServer(profile, ground_truth=gt, force=True) as sim:
        args = argparse.Namespace(
            url=sim.url, concurrency=3, requests=7, prompt=32, output=12, stamps=stamps
        )
        got = await floor.main(args)
    assert got["requests"] == 7
    truth = pq.read_table(gt).to_pylist()
    assert len(truth) == 7
    chunks = sum(len(r["chunk_ns"]) for r in truth)
    # a read holds at least one chunk; the head and the last chunk may come alone
    assert 7 <= got["reads"] <= chunks + 2 * 7
    assert all(sum(r["chunk_tokens"]) == 12 for r in truth)


async def test_floor_stops_on_an_answer_that_is_not_a_stream(tmp_path):
    async with SimServer("fast") as sim:  # another model name: 404
        args = argparse.Namespace(
            url=sim.url, concurrency=2, requests=3, prompt=8, output=4, stamps="kernel"
        )
        with pytest.raises(SystemExit, match="404"):
            await floor.main(args)
