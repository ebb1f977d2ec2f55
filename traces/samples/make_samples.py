"""Regenerate the bundled sample traces (synthetic; no third-party data).

    .venv/bin/python traces/samples/make_samples.py

agent-small.parquet: 8 agent sessions, ~60 requests over ~20-40 s, 16-token blocks, a
shared 512-token system prompt, prompts growing turn by turn (up to ~3000 tokens),
outputs of 20-300 tokens, think times of ~0.1-5 s. The demo replays it.
agent-medium.parquet: 64 sessions, 64-token blocks, a longer tail, for tests and plots.
"""

from __future__ import annotations

from pathlib import Path

from agent_replay.traces.io import write_trace
from agent_replay.traces.synth import Dist, SynthConfig, SynthModel, synthesize

HERE = Path(__file__).resolve().parent


def small_model() -> SynthModel:
    return SynthModel(
        turns=Dist(7.5, 0.25, 5, 10),
        first_input=Dist(900, 0.3, 600, 1400),
        growth=Dist(120, 0.6, 20, 400),
        output=Dist(80, 0.6, 20, 300),
        think_s=Dist(0.8, 0.8, 0.1, 5.0),
        system_prompt_tokens=512,
        max_input=3000,
        session_rate=0.4,
        prefill_tok_s=20_000,
        decode_tok_s=60,
    )


def medium_model() -> SynthModel:
    return SynthModel(system_prompt_tokens=1024, max_input=24_000, session_rate=0.5)


def main() -> None:
    t, m = synthesize(
        small_model(), SynthConfig(sessions=8, seed=7, block_size=16, model_name="synthetic")
    )
    m.extra["description"] = (
        "8 synthetic agent sessions for the demo (traces/samples/make_samples.py)"
    )
    write_trace(t, HERE / "agent-small.parquet", m, force=True)
    t, m = synthesize(
        medium_model(), SynthConfig(sessions=64, seed=11, block_size=64, model_name="synthetic")
    )
    m.extra["description"] = "64 synthetic agent sessions (traces/samples/make_samples.py)"
    write_trace(t, HERE / "agent-medium.parquet", m, force=True)


if __name__ == "__main__":
    main()
