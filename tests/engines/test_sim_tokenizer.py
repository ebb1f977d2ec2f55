"""The simulated engine's documented tokenizer and chat template."""

from __future__ import annotations

from agent_replay.engines.sim.tokenizer import (
    FIRST_WORD_ID,
    SimTokenizer,
    letters_for_rank,
    synthesize_text,
)

TOK = SimTokenizer(32000)


def test_pieces_follow_the_rule() -> None:
    assert TOK.pieces("hello world") == ["hell", "o", " worl", "d"]
    assert TOK.pieces("a  b\n\nc") == ["a", " ", " b", "\n", "\nc"]
    assert TOK.count(synthesize_text(123)) == 123
    assert TOK.count("") == 0


def test_letter_pieces_have_rank_ids_and_generated_text_round_trips() -> None:
    assert (
        letters_for_rank(0) == "a" and letters_for_rank(25) == "z" and letters_for_rank(26) == "aa"
    )
    assert TOK.encode(" a b") == [FIRST_WORD_ID, FIRST_WORD_ID + 1]
    ids = list(range(FIRST_WORD_ID, 32000, 997))
    assert TOK.encode(TOK.decode(ids)) == ids
    assert TOK.token_text(2) == ""  # specials have no text


def test_other_pieces_map_deterministically_into_the_vocabulary() -> None:
    ids = TOK.encode("Héllo, World! 123")
    assert ids == SimTokenizer(32000).encode("Héllo, World! 123")
    assert all(FIRST_WORD_ID <= i < 32000 for i in ids)


def test_chat_template_overhead_is_five_per_message_plus_three() -> None:
    msgs = [
        {"role": "system", "content": " abcd" * 4},
        {"role": "user", "content": [{"type": "text", "text": " abcd" * 6}]},
    ]
    ids = TOK.chat_ids(msgs)
    assert len(ids) == 4 + 5 + 6 + 5 + 3
    assert len(TOK.chat_ids(msgs, add_generation_prompt=False)) == 4 + 5 + 6 + 5
    # the same conversation with one more turn shares the whole earlier prefix
    longer = TOK.chat_ids(
        [*msgs, {"role": "assistant", "content": " abcd"}, {"role": "user", "content": "x"}]
    )
    assert longer[: len(ids) - 3] == ids[:-3]
