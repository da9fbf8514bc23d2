"""build_columns: the one function that builds ids / loss mask / log-probs / segments (hand-drawn cases)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.errors import ConfigError
from agentrl.masking import Piece, build_columns
from agentrl.types import Segment, TokenSource, Trajectory

P, M, OBS, T = TokenSource.PROMPT, TokenSource.MODEL, TokenSource.OBSERVATION, TokenSource.TEMPLATE


def test_two_turns_with_tool_reply():
    """A two-turn episode, drawn by hand (ChatML-like ids: 1=<|im_start|>, 2=<|im_end|>, 10="\\n").

    pieces   prompt [1 9 8 2 10 1 7 10]   (message 0, then the generation prompt [1 7 10])
             model  [5 6 2]  lp [-.1 -.2 -.3]   turn 0, message 1
             templ  [10]                         separator after <|im_end|>, never sampled
             obs    [1 4 2 10]                   tool reply, message 2
             templ  [1 7 10]                     next generation prompt
             model  [3 2]    lp [-.4 -.5]        turn 1, message 3

    ids      1 9 8 2 10 1 7 10 | 5  6  2  | 10 | 1 4 2 10 | 1 7 10 | 3  2
    mask     0 0 0 0 0  0 0 0  | 1  1  1  | 0  | 0 0 0 0  | 0 0 0  | 1  1
    """
    cols = build_columns(
        [
            Piece(P, (1, 9, 8, 2, 10), -1, 0),
            Piece(P, (1, 7, 10), -1, None),
            Piece.sampled((5, 6, 2), (-0.1, -0.2, -0.3), 0, 1),
            Piece(T, (10,), 0),
            Piece(OBS, (1, 4, 2, 10), 0, 2),
            Piece(T, (1, 7, 10), 0),
            Piece.sampled((3, 2), (-0.4, -0.5), 1, 3),
        ]
    )
    assert cols.token_ids == (1, 9, 8, 2, 10, 1, 7, 10, 5, 6, 2, 10, 1, 4, 2, 10, 1, 7, 10, 3, 2)
    assert cols.loss_mask == (0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1)
    n = None
    assert cols.logprobs == (n, n, n, n, n, n, n, n, -0.1, -0.2, -0.3, n, n, n, n, n, n, n, n, -0.4, -0.5)
    assert cols.segments == (
        Segment(P, 0, 5, -1, 0),
        Segment(P, 5, 8, -1, None),
        Segment(M, 8, 11, 0, 1),
        Segment(T, 11, 12, 0, None),
        Segment(OBS, 12, 16, 0, 2),
        Segment(T, 16, 19, 0, None),
        Segment(M, 19, 21, 1, 3),
    )


def test_empty_pieces_are_skipped_and_equal_neighbours_merge():
    """prompt [1 2] + prompt [] + templ [10] + templ [11] (same turn) -> segments P[0,2) T[2,4)."""
    cols = build_columns(
        [Piece(P, (1, 2), -1, 0), Piece(P, (), -1, 1), Piece(T, (10,), 0), Piece(T, (11,), 0)]
    )
    assert cols.token_ids == (1, 2, 10, 11)
    assert cols.segments == (Segment(P, 0, 2, -1, 0), Segment(T, 2, 4, 0, None))


def test_truncated_turn_stays_masked_in():
    """A turn cut by length has no stop token but is still what the policy sampled.

    prompt [1 7 10]; model [5 6 7] (no <|im_end|>)  ->  mask 0 0 0 1 1 1
    """
    cols = build_columns([Piece(P, (1, 7, 10), -1), Piece.sampled((5, 6, 7), (-1.0, -2.0, -3.0), 0, 1)])
    assert cols.loss_mask == (0, 0, 0, 1, 1, 1)
    assert cols.logprobs[3:] == (-1.0, -2.0, -3.0)


@pytest.mark.parametrize(
    "piece, message",
    [
        (Piece(M, (5, 6), 0, 1, None), "need 2 log-probs"),
        (Piece(M, (5, 6), 0, 1, (-0.1,)), "need 2 log-probs"),
        (Piece(M, (5,), 0, 1, (0.5,)), "not a finite number <= 0"),
        (Piece(M, (5,), 0, 1, (float("nan"),)), "not a finite number <= 0"),
        (Piece(OBS, (5,), 0, 2, (-0.1,)), "carry no log-probs"),
        (Piece(T, (10,), 0, None, ()), "carry no log-probs"),
    ],
)
def test_bad_pieces_are_rejected(piece, message):
    with pytest.raises(ConfigError, match=message):
        build_columns([Piece(P, (1,), -1), piece])


_sources = st.sampled_from([P, M, OBS, T])


@st.composite
def _pieces(draw):
    out = []
    for turn, source in enumerate(draw(st.lists(_sources, max_size=12))):
        ids = tuple(draw(st.lists(st.integers(0, 100), max_size=5)))
        lps = tuple(-float(i) / 10 for i in range(len(ids))) if source is M else None
        out.append(Piece(source, ids, turn, turn, lps))
    return out


@given(_pieces())
def test_mask_is_one_exactly_on_sampled_tokens(pieces):
    cols = build_columns(pieces)
    expected_mask = [1 if p.source is M else 0 for p in pieces for _ in p.token_ids]
    assert list(cols.loss_mask) == expected_mask
    assert [lp is not None for lp in cols.logprobs] == [bool(m) for m in expected_mask]
    # The columns form a valid trajectory (segments tile the ids, mask matches MODEL segments).
    Trajectory(cols.token_ids, cols.loss_mask, cols.logprobs, cols.segments, ()).validate()
