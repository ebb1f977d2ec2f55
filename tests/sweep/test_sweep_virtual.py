"""A sweep target on the simulated engine in virtual time (``virtual = "PROFILE"``): the
runs, the index and a capacity search, with no server started."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError
from agent_replay.replay.sweep.experiment import load_experiment
from tests.replay.helpers import MS, chain_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]


def _exp(tmp: Path, target: str) -> Path:
    trace = write_rows(tmp / "t.parquet", chain_rows(12, 6, think_ns=200 * MS, output_tokens=40))
    profile = tmp / "p.json"
    # each decoding sequence adds 1 ms to a 2 ms step: per-user speed falls with the batch
    profile.write_text(
        json.dumps(
            SimProfile(
                name="p",
                decode_base_ns=2 * MS,
                decode_per_seq_ns=1 * MS,
                prefix_cache_blocks=0,
                prefill_tokens_per_s=1e6,
            ).to_dict()
        )
    )
    exp = tmp / "exp.toml"
    exp.write_text(f"""
trace = "{trace}"
repeats = 1
slo = "p90_tps>=150"

[load]
axis = "concurrent_sessions"
points = [1, 2]

[run]
duration_s = 5
api = "completions"

[warmup]
enabled = false

[[targets]]
{target.replace("PROFILE", str(profile))}
""")
    return exp


def test_virtual_target_needs_exactly_one_kind(tmp_path: Path) -> None:
    exp = _exp(tmp_path, 'name = "v"\nvirtual = "PROFILE"\nsim = "fast"')
    with pytest.raises(InputError, match="exactly one of url, sim, launch, virtual"):
        load_experiment(exp)
    exp = _exp(tmp_path, 'virtual = "PROFILE"')
    t = load_experiment(exp).targets[0]
    assert (t.kind, t.name) == ("virtual", "p")


def test_capacity_on_the_virtual_engine(tmp_path: Path) -> None:
    exp = _exp(tmp_path, 'name = "v"\nvirtual = "PROFILE"')
    out = tmp_path / "sweep"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "sweep",
            str(exp),
            "--find-capacity",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    text = (out / "capacity.md").read_text()
    # one session decodes alone: 3 ms steps (2 ms + 1 ms for its sequence) = 333.33 tok/s
    assert "| v | 1 | 1 | 1 | yes | uncertain | 0 | 0 | 333.33" in text
    # the search ends between two adjacent session counts, the upper one failing
    m = re.search(
        r"capacity (\d+) = \d+ per GPU \(concurrent_sessions; between (\d+) and (\d+)\)", text
    )
    assert m is not None and int(m[3]) == int(m[2]) + 1 and m[1] == m[2]
    # steps of 2 + n ms: a speed of 150 tok/s needs batches under 4.7 on average at P90
    assert 4 <= int(m[1]) <= 12
    runs = list((out / "capacity" / "v").glob("*/r*/run.json")) or list(out.rglob("run.json"))
    assert runs and all(json.loads(p.read_text())["prediction"]["clock"] == "virtual" for p in runs)
