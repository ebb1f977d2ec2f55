"""Requests in flight and tokens/s per bin, pinned on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pytest

from agent_replay.analysis.timeseries import bin_edges, mean_in_flight, spread_rate

S = 1e9


def test_in_flight_is_the_mean_over_each_bin() -> None:
    # a: 0.5 s .. 1.5 s; b: 0 .. 0.25 s. Bin [0,1): 0.5 + 0.25 = 0.75; [1,2): 0.5; [2,3): 0
    edges = np.array([0, 1, 2, 3]) * S
    got = mean_in_flight(np.array([0.5, 0.0]) * S, np.array([1.5, 0.25]) * S, edges)
    assert got.tolist() == pytest.approx([0.75, 0.5, 0.0])


def test_short_requests_between_bin_edges_are_in_flight() -> None:
    """Ten 0.3 s requests, none spanning a whole second: sampled at the seconds they would
    show 0 in flight while tokens flow; averaged they show 0.3 per second each."""
    sent = np.arange(10) * 1.0 * S + 0.2 * S
    end = sent + 0.3 * S
    edges = np.arange(11) * S
    assert mean_in_flight(sent, end, edges).tolist() == pytest.approx([0.3] * 10)
    tok = spread_rate(sent, end, np.full(10, 60.0), edges)
    assert tok.tolist() == pytest.approx([60.0] * 10)


def test_tokens_are_spread_over_first_to_last_token() -> None:
    # 100 tokens over 0.5 .. 1.5 s: 50 in each of the first two bins; 7 tokens in one instant
    # at 2.2 s all in the third bin; NaNs (never sent) ignored
    edges = np.array([0, 1, 2, 3]) * S
    got = spread_rate(
        np.array([0.5, 2.2, np.nan]) * S,
        np.array([1.5, 2.2, 1.0]) * S,
        np.array([100, 7, 5]),
        edges,
    )
    assert got.tolist() == pytest.approx([50.0, 50.0, 7.0])


def test_bins_are_seconds_with_the_last_one_ending_with_the_run() -> None:
    e = bin_edges(10 * S, 19.2 * S)
    assert e[0] == 10 * S and e[-1] == 19.2 * S and e.size == 11
    assert np.diff(e)[:-1].tolist() == pytest.approx([S] * 9)
    assert bin_edges(0, 0.35 * S).size == 5  # a short run: 0.1 s bins
    assert bin_edges(0, 3600 * S).size == 401  # a long one: at most 400 bins
