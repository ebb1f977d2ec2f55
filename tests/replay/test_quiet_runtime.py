"""The loop-stall distribution written to run.json, and the interpreter settings kept off
the measuring window (and restored after it)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_replay.replay.selfmon import QuietRuntime, stall_distribution

MS = 1_000_000


def test_stall_distribution_on_hand_made_lags() -> None:
    lags = [0] * 90 + [1_500_000] * 5 + [6 * MS] * 3 + [25 * MS, 120 * MS]
    d = stall_distribution(lags)
    assert d["ticks"] == 100
    assert d["p50_ns"] == 0
    # sorted: 0..89 are 0, 90..94 1.5 ms, 95..97 6 ms, 98 25 ms, 99 120 ms; nearest rank
    # (the report's rule) takes rank ceil(p/100 x 100): p90 -> the 90th (index 89), p99 ->
    # the 99th (index 98)
    assert d["p90_ns"] == 0
    assert d["p99_ns"] == 25 * MS
    assert d["max_ns"] == 120 * MS
    assert d["over_1ms"] == 10 and d["over_2ms"] == 5 and d["over_5ms"] == 5
    assert d["over_10ms"] == 2 and d["over_20ms"] == 2 and d["over_50ms"] == 1
    assert d["over_100ms"] == 1


def test_stall_distribution_empty() -> None:
    d = stall_distribution([])
    assert d["ticks"] == 0 and d["p99_ns"] is None and d["over_1ms"] == 0


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_quiet_runtime_disables_gc_and_restores_settings() -> None:
    old = sys.getswitchinterval()
    assert gc.isenabled()
    q = QuietRuntime(switch_interval_s=0.0005, young_threshold=150)
    q.enter()
    try:
        assert not gc.isenabled()
        assert sys.getswitchinterval() == 0.0005
        assert gc.get_freeze_count() > 0
        q.young()  # fewer than 150 new objects since enter: no collection
        assert q.young_collections == 0
        for _ in range(300):
            _Cycle()  # at least one tracked object each
        q.young()  # young cycles are collected here, not at exit
        assert q.young_collections == 1 and gc.get_count()[0] < 150
        for _ in range(50):
            c = _Cycle()
            gc.collect(0)  # survives two young generations: only exit finds it
            gc.collect(1)
            del c
    finally:
        q.exit()
    assert gc.isenabled()
    assert sys.getswitchinterval() == old
    assert gc.get_freeze_count() == 0
    st = q.stats()
    assert st["gc_young_collections"] == 1
    assert st["gc_end_collected"] >= 50  # each _Cycle is one object (plus its __dict__)
    assert st["gc_young_max_ns"] > 0


def test_exit_collects_what_the_run_made_and_leaves_older_garbage_to_the_interpreter() -> None:
    """The end-of-run collection runs while the objects from before the run are frozen: it
    frees the run's cycles without a scan of everything the process holds; older cycles
    are the interpreter's own collections' to find, after ``exit``."""
    gc.collect()
    before = [_Cycle() for _ in range(40)]  # alive at enter: frozen with the rest
    q = QuietRuntime(young_threshold=10**9)
    q.enter()
    try:
        del before  # garbage now, but frozen: not the run's
        for _ in range(30):
            _Cycle()
    finally:
        q.exit()
    assert 30 <= q.end_collected < 70  # the run's 30 cycles (an object and its __dict__)
    assert gc.collect() >= 40  # the older ones, once unfrozen


_FDSIZE = r"""
import json, resource, sys, threading
from agent_replay.replay.selfmon import reserve_fds

def fdsize():
    return int(next(l for l in open("/proc/self/status") if l.startswith("FDSize:")).split()[1])

threading.Thread(target=lambda: None).start()  # several threads: the case that waits on RCU
before = fdsize()
size = reserve_fds(int(sys.argv[1]))
print(json.dumps({"before": before, "size": size, "after": fdsize(),
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
@pytest.mark.parametrize("limit", [300, 4096])
def test_reserve_fds_grows_the_table_before_the_run(limit: int) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    # a fresh process, whose table has not grown yet; its soft limit starts low
    p = subprocess.run(
        [sys.executable, "-c", _FDSIZE, str(limit)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )
    d = json.loads(p.stdout)
    assert d["before"] < want
    assert d["soft"] >= want  # the soft limit was raised to what the table holds
    assert d["size"] == want
    assert d["after"] >= want  # the kernel's table holds `want` descriptors now: no growth later
