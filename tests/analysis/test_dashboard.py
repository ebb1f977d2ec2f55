from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from agent_replay.analysis.dashboard import (
    DashboardProcess,
    bottleneck,
    progress_line,
    render_dashboard,
    sparkline,
)
from agent_replay.analysis.fixtures import synthetic_results
from agent_replay.analysis.gauges import scrape_gauges
from agent_replay.analysis.live import LiveStats


def _stats(n: int = 400) -> LiveStats:
    st = LiveStats()
    for row in synthetic_results(n, seed=5, failed_fraction=0.05).to_pylist():
        st.observe_request(row)
        st.observe_lag(200_000, 50_000)
    st.set_progress(n, 1000, 12, 7, 9_000_000_000, 35.0)
    return st


def _draw(st: LiveStats, width: int = 100, height: int = 30, **kw: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, height=height, color_system=None).print(
        render_dashboard(st, width, height, **kw)
    )  # type: ignore[arg-type]
    return buf.getvalue()


def test_dashboard_fits_100x30_and_shows_everything() -> None:
    out = _draw(
        _stats(),
        server_gauges={"vllm:num_requests_running": 12.0, "vllm:kv_cache_usage_perc": 0.42},
    )
    lines = out.splitlines()
    assert len(lines) <= 30 and max(len(x) for x in lines) <= 100
    for needle in (
        "400/1,000 requests",
        "ETA",
        "sessions 7",
        "in flight 12",
        "TTFT",
        "TPOT",
        "ITL (per token)",
        "chunk gap",
        "E2E",
        "req TPS",
        "P99.9",
        "output tok/s",
        "errors: ",
        "tokens/chunk: 1:",
        "schedule lag P50 0.20",
        "CPU 35%",
        "running 12",
        "KV cache 42%",
    ):
        assert needle in out, needle
    assert "bottleneck" not in out


def test_bottleneck_warning_and_plain_line() -> None:
    st = _stats(200)
    st.set_progress(200, 1000, 3, 2, 1_000_000_000, 97.0)
    for _ in range(200):
        st.observe_lag(25_000_000, 0)
    why = bottleneck(st)
    assert why is not None and "CPU 97% of a core" in why and "schedule lag p99 25.0 ms" in why
    assert "WARNING load generator saturated" in _draw(st)
    line = progress_line(st, 1000)
    assert line.startswith("200/1,000 requests") and "P90 TPS" in line and "saturated" in line


def test_lag_at_low_cpu_does_not_advise_more_workers() -> None:
    st = _stats(200)
    st.set_progress(200, 1000, 3, 2, 1_000_000_000, 7.0)
    for _ in range(200):
        st.observe_lag(25_000_000, 0)
    why = bottleneck(st)
    assert why is not None and "CPU at 7% of a core" in why
    assert "more --workers would not help" in why and "use more --workers" not in why
    assert "WARNING" not in _draw(st)
    # with the host's CPU measured: other processes kept it busy, so it is contention
    from agent_replay.analysis.selfcheck import Machine

    busy = Machine(cpus=2, busy_cores=1.9, steal=0.0, ours_cores=0.07)
    assert "host contention" in progress_line(st, 1000, busy)
    assert "host contention" in str(bottleneck(st, busy))


def test_empty_stats_render() -> None:
    out = _draw(LiveStats(), total_requests=10)
    assert "0/10 requests" in out and "errors: none" in out


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 4], 10) == "▁▃▅█"
    assert sparkline([5.0] * 20, 4) == "████"
    assert sparkline([], 5) == ""


@pytest.fixture
def metrics_url() -> Iterator[str]:
    body = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        b'vllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
        b"# TYPE vllm:num_preemptions counter\n"
        b'vllm:num_preemptions_total{engine="0",model_name="m"} 9.0\n'
    )

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()
    srv.server_close()


def test_scrape_gauges(metrics_url: str) -> None:
    g = scrape_gauges(metrics_url)
    assert g == {"vllm:num_requests_running": 7.0, "vllm:num_preemptions": 9.0}


@pytest.mark.slow
def test_dashboard_process_renders_plain_lines(capfd: pytest.CaptureFixture[str]) -> None:
    st = _stats(100)
    d = DashboardProcess(total_requests=100, title="t", tty=False)
    d.start()
    assert d._ready.is_set()  # start() returns once the renderer has started up
    if hasattr(os, "SCHED_IDLE"):  # Linux: it runs only on CPU time no worker wants
        assert os.sched_getscheduler(d._proc.pid) == os.SCHED_IDLE
    try:
        assert d.update(st.encode()) is True
        assert d.update(b"x" * (5 << 20)) is False  # larger than the slot: skipped
    finally:
        d.stop()
    out = capfd.readouterr().out
    assert "100/100 requests" in out and "P90 TPS" in out
    assert d.sent == 1 and d.skipped == 1


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_stop_puts_the_renderer_back_at_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under SCHED_IDLE on a host with no idle CPU the renderer is not scheduled for seconds
    and would not even see the stop; stop() gives it the normal policy back before it waits
    (where Linux permits: root, or RLIMIT_NICE allowing nice 0)."""
    import resource

    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20:
        pytest.skip("leaving SCHED_IDLE needs root or RLIMIT_NICE >= 20 here")
    d = DashboardProcess(total_requests=1, title="t", tty=False)
    d.start()
    proc = d._proc
    assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
    policy_at_join: list[int] = []
    join = proc.join

    def watched_join(timeout: float | None = None) -> None:
        policy_at_join.append(os.sched_getscheduler(proc.pid))
        join(timeout)

    monkeypatch.setattr(proc, "join", watched_join)
    d.stop()
    assert policy_at_join[0] == os.SCHED_OTHER
    assert not proc.is_alive()


def test_renderer_waits_for_the_first_snapshot_and_survives_a_bad_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The render loop itself, on a thread: it must poll before any snapshot arrived (sequence
    # 0, empty slot) without dying, skip a damaged snapshot, and show the next good one.
    from agent_replay.analysis import dashboard

    monkeypatch.setattr(dashboard, "_yield_cpu", lambda: None)  # no renice of the test process
    monkeypatch.setattr(dashboard, "FPS", 50.0)
    d = DashboardProcess(total_requests=100, title="t", tty=False)
    th = threading.Thread(
        target=dashboard._render_loop,
        args=(d._buf, d._seq, d._len, d._lock, d._stop, 100, "t", None, False),
    )
    th.start()
    try:
        threading.Event().wait(0.2)  # ~10 polls of an empty slot
        assert th.is_alive()
        assert d.update(b"{not json")
        threading.Event().wait(0.1)
        assert th.is_alive()
        assert d.update(_stats(100).encode())
        threading.Event().wait(0.1)
    finally:
        d._stop.set()
        th.join(5.0)
    assert not th.is_alive()
    assert "100/100 requests" in capsys.readouterr().out


def test_dashboard_process_computes_request_stats_from_the_part_files(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A local run's dashboard: the workers write part files and send progress only; the
    # renderer's process reads the parts. Two requests with TTFT 10 and 30 ms (sent at 2 ms)
    # and 4 tokens in 4 chunks 5 ms apart (TPOT 5 ms: 200 tok/s); the part being written
    # (a temporary name) is not read.
    from agent_replay.replay.outcome import RequestRecord
    from agent_replay.replay.results import ResultWriter

    ms = 1_000_000
    w = ResultWriter(tmp_path, t0_ns=0)
    for i, first in enumerate((12 * ms, 32 * ms)):
        r = RequestRecord(
            session_id=f"s{i}",
            request_index=0,
            parent_index=-1,
            clone=0,
            worker=0,
            request_id=f"r{i}",
            api="completions",
            expected_input_tokens=10,
            expected_output_tokens=4,
            implied_cached_tokens=None,
        )
        r.intended_ns, r.sent_ns, r.first_token_ns = 2 * ms, 2 * ms, first
        r.chunk_ns.extend(first + k * 5 * ms for k in range(4))
        r.chunk_tokens.extend([1] * 4)
        r.end_ns, r.status, r.completion_tokens = first + 15 * ms, "ok", 4
        w.add(r)
    w.close()
    (tmp_path / "requests" / ".part-000-00001.parquet.tmp").write_bytes(b"not yet a parquet file")
    progress = LiveStats()
    progress.set_progress(2, 2, 0, 0, 50 * ms, 10.0)
    d = DashboardProcess(total_requests=2, title="t", tty=False, results_dir=str(tmp_path))
    d.start()
    try:
        assert d.update(progress.encode())
    finally:
        d.stop()
    out = capfd.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("2/2 requests, 0 failed"), out
    assert "P90 TPS 200.0 tok/s" in out and "TTFT P90 30.0 ms" in out, out


def test_gauge_sums_add_label_sets_and_counter_totals() -> None:
    from agent_replay.analysis.gauges import gauge_sums

    got = gauge_sums(
        [
            ("vllm:num_requests_running", 3),
            ("vllm:num_requests_running", 4),
            ("vllm:num_preemptions_total", 2),
            ("vllm:other", 9),
        ]
    )
    assert got == {"vllm:num_requests_running": 7.0, "vllm:num_preemptions": 2.0}


def _write_gauges(g: object) -> None:
    g.write({"vllm:num_requests_waiting": 5.0})  # type: ignore[attr-defined]


def test_shared_gauges_cross_processes() -> None:
    import multiprocessing as mp

    from agent_replay.analysis.gauges import SharedGauges

    g = SharedGauges()
    assert g.read() == (0, {})
    p = mp.get_context("spawn").Process(target=_write_gauges, args=(g,))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert g.read() == (1, {"vllm:num_requests_waiting": 5.0})


def test_eta_follows_the_plan_and_never_says_zero_while_requests_remain() -> None:
    from agent_replay.analysis.dashboard import eta_s

    s = 1_000_000_000
    # 5 s in, 10 of 57 done: the rate says 23.5 s, the trace's schedule 106 s more
    assert eta_s(10, 57, 5 * s, planned_ns=111 * s) == 106.0
    assert eta_s(10, 57, 5 * s) == 23.5
    assert eta_s(2, 57, 1 * s) is None  # under 5% done: no rate to extrapolate
    assert eta_s(2, 57, 1 * s, planned_ns=111 * s) == 110.0
    # the last session still running: a second at least, not 0:00
    assert eta_s(56, 57, 110 * s, planned_ns=100 * s) == pytest.approx(max(110 / 56, 1.0))
    assert eta_s(57, 57, 111 * s) is None


def test_dashboard_shows_the_labelled_p90_tps_headline() -> None:
    from agent_replay.analysis.dashboard import live_headline, render_dashboard
    from agent_replay.analysis.live import LiveStats

    st = LiveStats()
    ms = 1_000_000
    for i in range(20):  # TPOT (c_m - c_1) / (N - k_1) = (i + 10) ms per token
        t0 = i * 100 * ms
        st.observe_request(
            {
                "status": "ok",
                "intended_ns": t0,
                "sent_ns": t0,
                "first_token_ns": t0 + 5 * ms,
                "end_ns": t0 + 5 * ms + 4 * (i + 10) * ms,
                "chunk_ns": [t0 + 5 * ms, t0 + 5 * ms + 4 * (i + 10) * ms],
                "chunk_tokens": [1, 4],
                "completion_tokens": 5,
            }
        )
    line = live_headline(st)
    # P90 of TPOT over 10..29 ms is the 18th value, 27 ms (HdrHistogram: to 3 digits)
    assert line.startswith("per-user decode speed, P90: 37.0 tok/s (90% of requests at least")
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(render_dashboard(st, 100, 30))
    assert line[:40] in buf.getvalue()
