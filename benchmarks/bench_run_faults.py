"""``agent-replay run`` under faults: a full disk (before, during, at the end of a run;
freed or not) and signals (SIGINT/SIGTERM to the parent, a worker, the group; kill -9 of
the parent; Ctrl-C in the first second). Prints one table row per scenario and try: rows
written against requests the engine finished, what the run reported, exit code, traceback,
orphans, ``.tmp`` leftovers, and the contract checks each outcome breaks (``problems``:
``Outcome.problems``; after a kill -9 of the whole group run.json can only stay
``running``, which ``report`` then calls dead). Needs root for the tmpfs.

    PYTHONPATH=. python benchmarks/bench_run_faults.py [--repo TREE] [--tries N] [--only NAME] [--ray]

``--repo``: the code tree whose ``agent-replay run`` is probed (default this one; e.g. an
export of main: ``git archive main | tar -x -C /tmp/main``)."""

from __future__ import annotations

import argparse
import signal
import tempfile
from pathlib import Path

from tests.faults import runprobe as rp
from tests.replay.helpers import MS, chain_rows, write_rows

SCENARIOS: dict[str, tuple[rp.Fault | None, dict[str, object]]] = {
    "no fault, 2 workers": (None, {"workers": 2}),
    "disk full mid-run, freed after 1.5 s, 1 worker": (
        rp.after_first_part(rp.disk_full(1.5)),
        {"tmpfs": "6m"},
    ),
    "disk full mid-run, freed after 1.5 s, 2 workers": (
        rp.after_first_part(rp.disk_full(1.5)),
        {"tmpfs": "6m", "workers": 2},
    ),
    "disk full mid-run, never freed, 1 worker": (
        rp.after_first_part(rp.disk_full(None)),
        {"tmpfs": "6m"},
    ),
    "disk full mid-run, never freed, 2 workers": (
        rp.after_first_part(rp.disk_full(None)),
        {"tmpfs": "6m", "workers": 2},
    ),
    "disk full at the end, freed during the last retries, 2 workers": (
        rp.after_rows(400, rp.disk_full(4.0)),
        {"tmpfs": "6m", "workers": 2},
    ),
    "disk full before start, 1 worker": (None, {"tmpfs": "6m", "fill_first": True}),
    "disk full before start, 2 workers": (None, {"tmpfs": "6m", "fill_first": True, "workers": 2}),
    "SIGINT to parent, 2 workers": (
        rp.after_first_part(rp.to_parent(signal.SIGINT)),
        {"workers": 2},
    ),
    "SIGTERM to parent, 2 workers": (
        rp.after_first_part(rp.to_parent(signal.SIGTERM)),
        {"workers": 2},
    ),
    "SIGINT to group (Ctrl-C), 2 workers": (
        rp.after_first_part(rp.to_group(signal.SIGINT)),
        {"workers": 2},
    ),
    "SIGTERM to group, 2 workers": (
        rp.after_first_part(rp.to_group(signal.SIGTERM)),
        {"workers": 2},
    ),
    "SIGTERM to group, 1 worker": (rp.after_first_part(rp.to_group(signal.SIGTERM)), {}),
    "SIGINT to a worker, 2 workers": (
        rp.after_first_part(rp.to_worker(signal.SIGINT)),
        {"workers": 2},
    ),
    "SIGTERM to a worker, 2 workers": (
        rp.after_first_part(rp.to_worker(signal.SIGTERM)),
        {"workers": 2},
    ),
    "kill -9 of parent, 2 workers": (
        rp.after_first_part(rp.to_parent(signal.SIGKILL)),
        {"workers": 2},
    ),
    "kill -9 of the group, 2 workers": (
        rp.after_first_part(rp.to_group(signal.SIGKILL)),
        {"workers": 2},
    ),
    "Ctrl-C as workers start, 2 workers": (
        rp.when_workers_start(rp.to_group(signal.SIGINT)),
        {"workers": 2},
    ),
    "Ctrl-C at 0.5 s, 2 workers": (rp.early(rp.to_group(signal.SIGINT), 0.5), {"workers": 2}),
    "Ctrl-C at 1.0 s, 2 workers": (rp.early(rp.to_group(signal.SIGINT), 1.0), {"workers": 2}),
    "Ctrl-C at 0.5 s, 1 worker": (rp.early(rp.to_group(signal.SIGINT), 0.5), {}),
}

RAY_SCENARIOS: dict[str, tuple[rp.Fault | None, dict[str, object]]] = {
    "no fault, --ray=local, 2 actors": (
        None,
        {"extra": ("--ray=local", "--ray-actors-per-node", "2"), "timeout_s": 120},
    ),
    "kill -9 of parent, --ray=local, 2 actors": (
        rp.after_first_part(rp.to_parent(signal.SIGKILL)),
        {"extra": ("--ray=local", "--ray-actors-per-node", "2"), "timeout_s": 120},
    ),
    "kill -9 of the group, --ray=local, 2 actors": (
        rp.after_first_part(rp.to_group(signal.SIGKILL)),
        {"extra": ("--ray=local", "--ray-actors-per-node", "2"), "timeout_s": 120},
    ),
    "SIGTERM to parent, --ray=local, 2 actors": (
        rp.after_first_part(rp.to_parent(signal.SIGTERM)),
        {"extra": ("--ray=local", "--ray-actors-per-node", "2"), "timeout_s": 120},
    ),
    "SIGINT to parent, --ray=local, 2 actors": (
        rp.after_first_part(rp.to_parent(signal.SIGINT)),
        {"extra": ("--ray=local", "--ray-actors-per-node", "2"), "timeout_s": 120},
    ),
}
"""With ``--ray``: the same probes on a private one-node Ray (needs the ray extra; Ray's
own processes, started by the run, count as its children)."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", type=Path, default=rp.ROOT)
    ap.add_argument("--tries", type=int, default=1)
    ap.add_argument("--only", default=None, help="scenarios whose name contains this")
    ap.add_argument("--sessions", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--ray", action="store_true", help="also the Ray scenarios (RAY_SCENARIOS)")
    args = ap.parse_args()
    scenarios = {**SCENARIOS, **(RAY_SCENARIOS if args.ray else {})}
    with tempfile.TemporaryDirectory(prefix="run-faults-") as tmp:
        trace = write_rows(
            Path(tmp) / "t.parquet", chain_rows(args.sessions, 10, gap_ns=60 * MS, output_tokens=6)
        )
        print(rp.TABLE_HEAD, flush=True)
        bad: list[str] = []
        for name, (fault, opts) in scenarios.items():
            if args.only and args.only not in name:
                continue
            for k in range(args.tries):
                kw = {"timeout_s": args.timeout, **opts}
                o = rp.probe(
                    name,
                    trace,
                    Path(tmp) / f"{len(name)}-{k}-{abs(hash(name))}",
                    fault,
                    repo=args.repo.resolve(),
                    **kw,
                )  # type: ignore[arg-type]
                print(o.row(), flush=True)
                if o.problems():
                    bad.append(name)
        print(f"\n{len(bad)} outcomes with problems" + (f": {', '.join(bad)}" if bad else ""))


if __name__ == "__main__":
    main()
