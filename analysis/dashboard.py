"""The live dashboard of ``agent-replay run``, rendered outside the measuring event loop.

``render_dashboard(stats, width, height)`` is pure: a LiveStats snapshot in, a rich
renderable out (tests draw it into ``Console(file=io.StringIO(), width=100)``).

``DashboardProcess`` renders in its own process, below the workers' CPU priority (SCHED_IDLE),
at most ~4 frames per second and only when something changed (a new snapshot, new server
gauges, a resized terminal, new result rows). Snapshots reach it through one shared-memory
slot: ``update`` copies the bytes in under a lock it never waits for (if the renderer is
reading, the frame is skipped: a newer one comes soon) and bumps a sequence number; the
renderer takes whatever is newest. Nothing is pickled, queued or rendered on the measuring
loop. Off a TTY it prints a plain progress line every few seconds instead of redrawing.

With ``results_dir`` the renderer computes the request statistics itself, from the part
files the workers write (``analysis.live.PartsFeed``), and the snapshots it is sent carry
only progress and the loop-lag probe: the measuring processes do no statistics at all.
Without it (the Ray pool), the snapshots are complete statistics merged by the sender.

Server gauges (running, waiting, KV cache, preemptions) come from the run's /metrics scraper
through ``SharedGauges`` when it runs, so the server is scraped once per interval, not once
more for the dashboard (a scrape takes time on the server's event loop: 3-5 ms round trip on
the simulated engine under load); the dashboard scrapes by itself only when the run does not.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from agent_replay import safetext as safe
from agent_replay.analysis import outcomes
from agent_replay.analysis.definitions import METRICS
from agent_replay.analysis.gauges import GAUGES, SharedGauges, scrape_gauges
from agent_replay.analysis.hist import PERCENTILES, min_count_for
from agent_replay.analysis.live import LiveStats, PartsFeed

FPS = 4.0
SLOT_BYTES = 4 << 20
SPARK = "▁▂▃▄▅▆▇█"
ROWS = tuple((m.key, m.label) for m in METRICS if m.live and m.rows != "all")
"""The latency table's rows: the definitions table's live entries (the schedule lag has its
own line)."""


def sparkline(values: list[float], width: int) -> str:
    vals = values[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in vals)


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v / 1e6
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:,.1f}" if ms >= 10 else f"{ms:.2f}"


def _hms(secs: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(secs)) if secs < 86_400 else ">1 day"


MIN_ETA_DONE = 0.05
"""No ETA before this share of the requests is done: the first ones finish early (short
prompts, no queue yet) and a rate extrapolated from them is minutes off."""


def eta_s(done: int, total: int, elapsed_ns: int, planned_ns: int = 0) -> float | None:
    """Seconds left: the later of the rate so far extrapolated to the requests left, and
    the plan's last intended send (``planned_ns`` after the start: the trace's own schedule,
    which think times hold the run to whatever the server's speed), plus a second while
    requests remain. None when nothing can be said yet."""
    if total <= done or elapsed_ns <= 0:
        return None
    by_plan = max(0.0, (planned_ns - elapsed_ns) / 1e9)
    if done < max(1, MIN_ETA_DONE * total):
        return by_plan or None
    by_rate = elapsed_ns / 1e9 * (total - done) / done
    return max(by_rate, by_plan, 1.0)


def _eta(done: int, total: int, elapsed_ns: int, planned_ns: int = 0) -> str:
    left = eta_s(done, total, elapsed_ns, planned_ns)
    return "-" if left is None else _hms(left)


def live_headline(stats: LiveStats) -> str:
    """The report's headline line (``analysis.report.headline``) on the live TPOT
    histogram: the P90 TPS so far, labelled as the report labels it."""
    from agent_replay.analysis.report import headline
    from agent_replay.analysis.runstats import tps_from_tpot

    stats.flush()
    return str(headline(tps_from_tpot(stats.hists["tpot"].summary()), stats.inexact)["text"])


def self_check(stats: LiveStats, machine: Any = None) -> Any:
    """The self-check policy (``analysis.selfcheck``) on the live figures: the busiest
    worker's CPU, the schedule and loop lag so far, and the host's CPU (``machine``, an
    ``analysis.selfcheck.Machine``, when the caller measures it)."""
    from agent_replay.analysis.selfcheck import assess

    sl, ll = stats.hists["schedule_lag"], stats.hists["loop_lag"]
    return assess(
        schedule_lag_p99_ns=sl.percentiles([99.0])[99.0] if sl.count else None,
        schedule_lag_n=sl.count,
        loop_lag_p99_ns=ll.percentiles([99.0])[99.0] if ll.count else None,
        loop_lag_n=ll.count,
        cpu_fraction=max(stats.cpu_percent) / 100 if stats.cpu_percent else 0.0,
        machine=machine,
    )


def bottleneck(stats: LiveStats, machine: Any = None) -> str | None:
    """The self-check's line, or None when all is well."""
    line: str | None = self_check(stats, machine).line
    return line


class HostWatch:
    """The host's CPU since the dashboard started, with our own use (the workers' CPU as
    they report it, and this process's) taken out: what tells host contention from our own
    saturation while the run goes."""

    def __init__(self) -> None:
        from agent_replay.analysis.selfcheck import MachineMeter

        self.meter = MachineMeter()
        self.t0 = time.monotonic()
        t = os.times()
        self.own0 = t.user + t.system

    def machine(self, stats: LiveStats) -> Any:
        t = os.times()
        own = t.user + t.system - self.own0
        workers = sum(stats.cpu_percent) / 100 * (time.monotonic() - self.t0)
        return self.meter.machine(own + workers)


def render_dashboard(
    stats: LiveStats,
    width: int = 100,
    height: int = 30,
    *,
    total_requests: int | None = None,
    title: str = "agent-replay",
    server_gauges: Mapping[str, float] | None = None,
    gpu_line: str = "",
    machine: Any = None,
    planned_ns: int = 0,
) -> Group:
    """One frame of the dashboard (fits ``width`` x ``height``; 100 x 30 shows everything).
    ``machine``: the host's CPU (``HostWatch``), for the self-check."""
    stats.flush()
    total = total_requests or stats.total
    done = stats.done or (stats.ok + stats.failed + stats.warmup)
    parts: list[Any] = []
    head = Table.grid(expand=True)
    head.add_column(ratio=1)
    head.add_column(justify="right")
    head.add_row(
        safe.text(title, style="bold"),
        Text(
            f"{done:,}/{total:,} requests  elapsed {_hms(stats.elapsed_ns / 1e9)}"
            f"  ETA {_eta(done, total, stats.elapsed_ns, planned_ns)}"
        ),
    )
    parts.append(head)
    parts.append(Text(live_headline(stats), style="bold green"))
    bar = Table.grid()
    bar.add_row(
        ProgressBar(total=max(total, 1), completed=min(done, max(total, 1)), width=width - 2)
    )
    parts.append(bar)
    _, tok, req = stats.throughput_series(last=max(10, width - 30))
    recent = float(tok[-10:].mean()) if tok.size else 0.0
    parts.append(
        Text(
            f"sessions {stats.active_sessions:,}  in flight {stats.in_flight:,}  "
            f"ok {stats.ok:,}  {outcomes.text(stats.errors).replace(',', ' ')}  "
            f"warmup {stats.warmup:,}  "
            f"output {recent:,.0f} tok/s (10 s)"
        )
    )
    parts.append(_latency_table(stats))
    parts.append(
        Text("* too few samples; TPS column Pxx = speed reached by xx% of requests", style="dim")
    )
    spark_w = max(10, width - 26)
    parts.append(
        Text(
            f"output tok/s {sparkline(tok.tolist(), spark_w)} "
            f"{(tok.max() if tok.size else 0):,.0f} max"
        )
    )
    parts.append(
        Text(
            f"requests/s   {sparkline(req.tolist(), spark_w)} "
            f"{(req.max() if req.size else 0):,.1f} max"
        )
    )
    errs = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.errors.items(), key=lambda kv: -kv[1]))
    parts.append(safe.text(f"errors: {errs or 'none'}", style="red" if errs else ""))
    parts += _state_lines(stats, machine, server_gauges, gpu_line)
    return Group(*parts)


def _latency_table(stats: LiveStats) -> Table:
    """The live percentiles (``*``: too few samples for it) and request TPS from TPOT's."""
    t = Table(show_edge=False, pad_edge=False, expand=False, box=None, header_style="bold")
    t.add_column("metric (ms)")
    t.add_column("count", justify="right")
    for p in PERCENTILES:
        t.add_column(f"P{p:g}", justify="right")
    t.add_column("max", justify="right")
    for key, label in ROWS:
        h = stats.hists[key]
        vals = h.percentiles()
        cells = [
            _ms(vals[p]) + ("*" if h.count < min_count_for(p) and vals[p] is not None else "")
            for p in PERCENTILES
        ]
        t.add_row(label, f"{h.count:,}", *cells, _ms(h.max))
    tp = stats.hists["tpot"]
    tv = tp.percentiles()
    tps = ["-" if tv[p] in (None, 0) else f"{1e9 / tv[p]:,.1f}" for p in PERCENTILES]  # type: ignore[operator]
    t.add_row("req TPS (tok/s)", f"{tp.count:,}", *tps, "")
    return t


def _state_lines(
    stats: LiveStats, machine: Any, server_gauges: Mapping[str, float] | None, gpu_line: str
) -> list[Text]:
    """Inexact counts, tokens per chunk, the load generator and its self-check, the
    server's gauges and the GPUs: each line only when it has something to say."""
    lines = []
    if stats.inexact:
        lines.append(Text(inexact_line(stats.inexact), style="yellow"))
    if sum(stats.tokens_per_chunk.values()):
        lines.append(_chunks_line(stats.tokens_per_chunk))
    lines.append(_load_generator_line(stats))
    check = self_check(stats, machine)
    if check.line:
        lines.append(
            Text(
                ("WARNING " if check.bottleneck else "warning: ") + check.line,
                style="bold red" if check.bottleneck else "yellow",
            )
        )
    if server_gauges:
        lines.append(_server_line(server_gauges))
    if gpu_line:  # engines.telemetry.gauges.line
        lines.append(Text(gpu_line))
    return lines


def _chunks_line(tokens_per_chunk: Mapping[int, int]) -> Text:
    """The share of chunks per token count (the first 8) and the mean."""
    n_chunks = sum(tokens_per_chunk.values())
    tpc = "  ".join(
        f"{k}:{100 * v / n_chunks:.0f}%" for k, v in sorted(tokens_per_chunk.items())[:8]
    )
    mean = sum(k * v for k, v in tokens_per_chunk.items()) / n_chunks
    return Text(f"tokens/chunk: {tpc}  mean {mean:.2f}")


def _server_line(server_gauges: Mapping[str, float]) -> Text:
    return Text(
        "server: "
        + "  ".join(
            f"{label} {server_gauges[name]:.0%}"
            if name.endswith("_perc")
            else f"{label} {server_gauges[name]:,.0f}"
            for name, label in GAUGES.items()
            if name in server_gauges
        )
    )


def _load_generator_line(stats: LiveStats) -> Text:
    """Schedule and loop lag, the workers' CPU, early sends and dropped samples."""
    sl = stats.hists["schedule_lag"].percentiles([50.0, 99.0])
    ll = stats.hists["loop_lag"].percentiles([99.0])
    cpu = " ".join(f"{c:.0f}%" for c in stats.cpu_percent[:8]) or "-"
    dropped = sum(h.dropped for h in stats.hists.values())
    return Text(
        f"load generator: schedule lag P50 {_ms(sl[50.0])} P99 {_ms(sl[99.0])} ms"
        f"  loop lag P99 {_ms(ll[99.0])} ms  CPU {cpu}"
        + (f"  early sends {stats.early_sends}" if stats.early_sends else "")
        + (f"  dropped samples {dropped}" if dropped else "")
    )


def progress_line(
    stats: LiveStats,
    total_requests: int | None = None,
    machine: Any = None,
    planned_ns: int = 0,
    said: set[str] | None = None,
) -> str:
    """The plain one-line form for non-TTY output. ``said``: the self-check lines already
    printed (updated here): a line said before is shown as a short marker."""
    stats.flush()
    total = total_requests or stats.total
    done = stats.done or (stats.ok + stats.failed + stats.warmup)
    tpot = stats.hists["tpot"].percentiles([90.0])[90.0]
    ttft = stats.hists["ttft"].percentiles([90.0])[90.0]
    p90 = f"{1e9 / tpot:,.1f}" if tpot else "-"
    line = (
        f"{done:,}/{total:,} requests, {outcomes.text(stats.errors)}, in flight "
        f"{stats.in_flight:,}, P90 TPS {p90} tok/s, TTFT P90 {_ms(ttft)} ms, "
        f"ETA {_eta(done, total, stats.elapsed_ns, planned_ns)}"
    )
    check = self_check(stats, machine)
    why = check.line
    if why and said is not None:
        if check.kind in said:
            why = f"{check.kind}, as said above"
        else:
            said.add(check.kind)
    return (
        line
        + (f" [{stats.inexact:,} inexact token counts: not in TPS]" if stats.inexact else "")
        + (f" [{why}]" if why else "")
    )


def inexact_line(n: int) -> str:
    return (
        f"inexact token counts: {n:,} ok requests (no token ids or continuous usage from "
        "the server): in TTFT, E2E, chunk gap and tok/s; not in TPOT, ITL, TPS, tokens/chunk"
    )


class _Inputs:
    """What the renderer reads each frame: the run's newest snapshot (``buf`` under
    ``lock``, numbered by ``seq``), the part files in ``results_dir``, the server's gauges
    (from the run's scraper, else scraped here) and the GPUs' line."""

    def __init__(
        self,
        buf: Any,
        seq: Any,
        length: Any,
        lock: Any,
        results_dir: str | None,
        gauges_url: str | None,
        shared_gauges: SharedGauges | None,
        gpu_gauges: Any,
    ) -> None:
        self.buf, self.seq, self.length, self.lock = buf, seq, length, lock
        self.feed = None if results_dir is None else PartsFeed(results_dir)
        self.gauges_url, self.shared_gauges, self.gpu_gauges = gauges_url, shared_gauges, gpu_gauges
        self.got: bytes | None = None  # the newest good snapshot
        self.parts = 0  # polls of the part files that found new ones
        self.seen = 0  # sequence number of the snapshot shown; 0: none has arrived yet
        self.stats: LiveStats | None = None
        self.gauges: dict[str, float] = {}
        self.gauges_seen = 0
        self.gpu_seen, self.gpu_text, self.gpu_at = 0, "", 0.0
        self.last_scrape = 0.0

    def refresh(self) -> float:
        """Read whatever is new; the time it was read at."""
        self._snapshot()
        feed = self.feed
        if feed is not None and feed.poll() and self.got is not None:
            self.parts += 1
            # progress and loop lag from the snapshot, requests from the part files
            self.stats = LiveStats.decode(self.got)
            self.stats.merge(feed.stats)
        now = time.monotonic()
        self._server_gauges(now)
        if (
            self.gpu_gauges is not None and now - self.gpu_at >= 0.5
        ):  # the sampler reads every 0.1 s
            n_gpu, text = self.gpu_gauges.line()
            if n_gpu != self.gpu_seen:
                self.gpu_seen, self.gpu_text, self.gpu_at = n_gpu, text, now
        return now

    def _snapshot(self) -> None:
        """A new snapshot of the run, when there is one; a damaged one is passed over (the
        last good one stays)."""
        if self.seq.value == self.seen or not self.lock.acquire(timeout=0.1):
            return
        try:
            self.seen = self.seq.value
            data = ctypes.string_at(ctypes.addressof(self.buf), self.length.value)
        finally:
            self.lock.release()
        try:
            fresh = LiveStats.decode(data)
        except ValueError:  # a damaged snapshot: keep showing the last good one
            return
        self.got, self.stats = data, fresh
        if self.feed is not None:
            fresh.merge(self.feed.stats)

    def _server_gauges(self, now: float) -> None:
        if self.shared_gauges is not None:
            n, fresh_gauges = self.shared_gauges.read()
            if n != self.gauges_seen:
                self.gauges_seen, self.gauges, self.last_scrape = n, fresh_gauges, now
        elif self.gauges_url and now - self.last_scrape > 1.0:
            self.last_scrape = now
            try:
                self.gauges = scrape_gauges(self.gauges_url)
            except (OSError, ValueError):
                self.gauges = {}

    def state(self, width: int, height: int) -> tuple[int, int, int, int, int, int]:
        """What a frame shows: a frame is drawn again only when this changed."""
        return (self.seen, self.parts, int(self.last_scrape * 1000), self.gpu_seen, width, height)


class _Display:
    """Where the frames go: a rich ``Live`` on a terminal (a frame drawn only when what it
    shows changed: one costs tens of ms of CPU), else a plain line every 5 s."""

    def __init__(self, tty: bool, total: int, title: str, planned_ns: int) -> None:
        self.console = Console(force_terminal=tty, width=None if tty else 120)
        self.total, self.title, self.planned_ns = total, title, planned_ns
        self.host = HostWatch()
        self.said: set[str] = set()  # self-check kinds printed in full on a progress line
        self.drawn: tuple[int, int, int, int, int, int] | None = None
        self.last_line = 0.0
        self.live: Any = None
        if tty:
            from rich.live import Live

            self.live = Live(console=self.console, auto_refresh=False, transient=False)
            self.live.start()

    def show(self, src: _Inputs, now: float, stopping: bool) -> None:
        stats = src.stats
        if stats is None:
            return
        if self.live is None:
            if stopping or now - self.last_line >= 5.0:
                self.last_line = now
                print(
                    progress_line(
                        stats, self.total, self.host.machine(stats), self.planned_ns, self.said
                    )
                    + (f" | {src.gpu_text}" if src.gpu_text else ""),
                    flush=True,
                )
            return
        size = self.console.size
        state = src.state(size.width, size.height)
        if state != self.drawn or stopping:
            self.drawn = state
            self.live.update(
                render_dashboard(
                    stats,
                    size.width,
                    size.height,
                    total_requests=self.total,
                    title=self.title,
                    server_gauges=src.gauges,
                    gpu_line=src.gpu_text,
                    machine=self.host.machine(stats),
                    planned_ns=self.planned_ns,
                ),
                refresh=True,
            )

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _render_loop(
    buf: Any,
    seq: Any,
    length: Any,
    lock: Any,
    stop: Any,
    total: int,
    title: str,
    gauges_url: str | None,
    tty: bool,
    results_dir: str | None = None,
    shared_gauges: SharedGauges | None = None,
    ready: Any = None,
    gpu_gauges: Any = None,
    planned_ns: int = 0,
) -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():  # its own process
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's: it stops us
    parent = os.getppid()  # ...or the run's end, however it ends (checked every frame)
    src = _Inputs(buf, seq, length, lock, results_dir, gauges_url, shared_gauges, gpu_gauges)
    display = _Display(tty, total, title, planned_ns)
    # Set up at the run's priority (under SCHED_IDLE on a host with no idle CPU it would
    # not get far), then below it for the run.
    _yield_cpu()
    if ready is not None:  # imports done, priority lowered: the run may start
        ready.set()
    try:
        while True:
            stopping = stop.is_set() or os.getppid() != parent
            display.show(src, src.refresh(), stopping)
            if stopping:
                break
            time.sleep(1.0 / FPS)
    finally:
        display.close()


def _yield_cpu() -> None:
    """Run the renderer below the measuring workers it shares the machine with: Linux's
    SCHED_IDLE (it gets only CPU time no other process wants, so a waking worker never
    waits for it; on a machine with no idle CPU the dashboard pauses, the measurement does
    not), else POSIX nice +10 (ignored where not permitted). With SCHED_IDLE a worker's
    loop lag is as without a dashboard (benchmarks/journal/2026-11-30-workers-on-one-host.md)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass


def _resume_cpu(pid: int) -> None:
    """The renderer ``pid`` back from SCHED_IDLE to the normal policy, once the run is over:
    on a host with no idle CPU, SCHED_IDLE leaves it unscheduled for seconds, so it would
    not even see the stop. Linux permits this to root, or where RLIMIT_NICE allows nice 0;
    elsewhere the renderer stays where it is (and its last frame may wait that long)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, OSError):
        pass


class DashboardProcess:
    """Renders snapshots in a child process; ``update`` never blocks the caller."""

    def __init__(
        self,
        total_requests: int,
        title: str = "agent-replay",
        server_gauges_url: str | None = None,
        *,
        tty: bool | None = None,
        results_dir: str | None = None,
        shared_gauges: SharedGauges | None = None,
        gpu_gauges: Any = None,
        planned_ns: int = 0,
    ) -> None:
        """Server gauges: from ``shared_gauges`` when given (another process scrapes), else
        scraped from ``server_gauges_url`` every second. ``gpu_gauges``: the GPU sampler's
        ``engines.telemetry.gauges.GpuGauges`` (its ``line()`` is shown). ``planned_ns``:
        the plan's last intended send after the start (the ETA is never before it)."""
        self.gpu_gauges = gpu_gauges
        self.planned_ns = planned_ns
        self.total_requests = total_requests
        self.results_dir = results_dir
        self.shared_gauges = shared_gauges
        self.title = title
        self.server_gauges_url = server_gauges_url
        self.tty = sys.stdout.isatty() if tty is None else tty
        ctx = mp.get_context("spawn")
        self._ctx = ctx
        self._buf = ctx.RawArray("B", SLOT_BYTES)
        self._seq = ctx.RawValue("q", 0)
        self._len = ctx.RawValue("q", 0)
        self._lock = ctx.Lock()
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._proc: Any = None
        self.sent = 0
        self.skipped = 0

    def start(self, wait_s: float = 30.0) -> None:
        """Start the renderer and wait (up to ``wait_s``) until it has imported what it
        needs and lowered its priority: a renderer starting up during a run would take CPU
        from the workers exactly then (on 2 cores: loop-lag spikes over the first second)."""
        self._proc = self._ctx.Process(
            target=_render_loop,
            name="agent-replay-dashboard",
            daemon=True,
            args=(
                self._buf,
                self._seq,
                self._len,
                self._lock,
                self._stop,
                self.total_requests,
                self.title,
                self.server_gauges_url,
                self.tty,
                self.results_dir,
                self.shared_gauges,
                self._ready,
                self.gpu_gauges,
                self.planned_ns,
            ),
        )
        self._proc.start()
        deadline = time.monotonic() + wait_s
        while not self._ready.wait(0.1) and time.monotonic() < deadline and self._proc.is_alive():
            pass

    def update(self, encoded: bytes) -> bool:
        """Offer a snapshot; False when it was skipped (renderer busy or snapshot too big)."""
        n = len(encoded)
        if n > SLOT_BYTES or not self._lock.acquire(block=False):
            self.skipped += 1
            return False
        try:
            ctypes.memmove(self._buf, encoded, n)
            self._len.value = n
            self._seq.value += 1
        finally:
            self._lock.release()
        self.sent += 1
        return True

    def stop(self, timeout: float = 20.0) -> None:
        """Draw the last frame and end the child process: the renderer is first put back
        at normal priority where Linux permits (``_resume_cpu``); it is ended without its last
        frame after ``timeout``, which a renderer left under SCHED_IDLE on a host with no
        idle CPU can reach."""
        if self._proc is None:
            return
        self._stop.set()
        _resume_cpu(self._proc.pid)  # the run is over: the last frame at its priority
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(1.0)
        self._proc = None

    def __enter__(self) -> DashboardProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
