"""Answering conversations in rounds (ringtrain.generate.rounds): the recipe's regenerator
writes one training row per assistant turn, each after the target's own earlier answers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.greedy import length_batches
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.prompt_sets import Conversation
from ringtrain.generate.prompts import read_prompt_records
from ringtrain.generate.rounds import SampledShare, answer_in_rounds, user_segments
from ringtrain.generate.sampling import TokenSampler
from tests.helpers.word_chat_model import VOCAB, build_word_chat_model

FIRST = {"role": "user", "content": "write a poem about the sea"}
OLD_ANSWER = {"role": "assistant", "content": "rain rain rain"}
SECOND = {"role": "user", "content": "why the rain"}


def test_user_segments_drop_the_given_assistant_turns() -> None:
    system = {"role": "system", "content": "how"}
    conversation = Conversation("c", messages=[system, FIRST, OLD_ANSWER, SECOND])
    assert user_segments(conversation) == [[system, FIRST], [SECOND]]


def test_messages_after_the_last_user_turn_are_no_turn() -> None:
    """A tool result after the last user turn is answered by no row of its own: one row
    per user turn."""
    tool = {"role": "tool", "content": "42"}
    conversation = Conversation("c", messages=[FIRST, OLD_ANSWER, tool, OLD_ANSWER])
    assert user_segments(conversation) == [[FIRST]]
    assert conversation.turns == 1


def test_every_user_turn_is_answered_after_the_targets_own_answers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    local = LocalModel.load(build_word_chat_model(tmp_path / "m"), "cpu", "float32", 8)
    renderer = ChatRenderer(local.tokenizer)
    ids = [VOCAB.index("<|im_start|>"), VOCAB.index("user"), VOCAB.index("code")]
    conversations = [
        Conversation("two", messages=[FIRST, OLD_ANSWER, SECOND]),
        Conversation("ids", input_ids=ids),
        Conversation("one", messages=[SECOND]),
    ]
    batches: list[int] = []
    prompts, answers, owners, stats = answer_in_rounds(
        local, conversations, renderer, 12, batches.append
    )

    assert len(prompts) == len(answers) == 4 and sum(batches) == 4
    assert owners == [0, 1, 2, 0]
    first_prompt = renderer.render([FIRST], "two turn 1")
    assert prompts[:3] == [first_prompt, ids, renderer.render([SECOND], "one turn 1")]
    reply = {"role": "assistant", "content": renderer.answer_text(answers[0].tokens)}
    assert reply["content"] != OLD_ANSWER["content"]
    assert prompts[3] == renderer.render([FIRST, reply, SECOND], "two turn 2")
    # Each answer is the target's greedy answer to its row's prompt, as if asked alone.
    alone, _ = local.answer([prompts[3]], 12)
    assert answers[3].tokens == alone[0].tokens
    assert stats.prompts == 4 and stats.new_tokens == sum(len(a.tokens) for a in answers)


def test_a_sampled_share_draws_its_conversations_answers_in_the_same_rows(
    tmp_path: Path,
) -> None:
    sampler = TokenSampler.seeded(5.0, 1.0, seed=1, device="cpu")
    assert SampledShare.spread(sampler, 10, 0.3).conversations == {3, 6, 9}
    assert SampledShare.spread(sampler, 4, 1.0).conversations == {0, 1, 2, 3}
    torch.manual_seed(0)
    local = LocalModel.load(build_word_chat_model(tmp_path / "m"), "cpu", "float32", 8)
    renderer = ChatRenderer(local.tokenizer)
    words = ["sea", "rain", "code", "poem", "why"]
    conversations = [
        Conversation(f"c{i}", messages=[{"role": "user", "content": f"write {w} {w}"}])
        for i, w in enumerate(words)
    ]
    conversations.append(Conversation("two", messages=[FIRST, OLD_ANSWER, SECOND]))
    greedy = answer_in_rounds(local, conversations, renderer, 12)
    share = SampledShare(sampler, frozenset({1, 3, 5}))
    mixed = answer_in_rounds(local, conversations, renderer, 12, sampled=share)
    assert mixed.conversations == greedy.conversations == [0, 1, 2, 3, 4, 5, 5]
    rows = range(len(greedy.answers))
    drawn = [row for row in rows if mixed.conversations[row] in share.conversations]
    for row in set(rows) - set(drawn):  # greedy rows as before (the second turn's history
        assert mixed.answers[row] == greedy.answers[row]  # is the drawn first answer)
    assert sum(mixed.answers[row] != greedy.answers[row] for row in drawn) >= 2
    # Round 1 answers in two calls (greedy, drawn), round 2 (conversation 5 alone) in one.
    assert mixed.stats.prompts == 7 and mixed.stats.batches == greedy.stats.batches + 1


def test_prompt_lines_end_at_newlines_only(tmp_path: Path) -> None:
    """JSON leaves U+2028, U+2029 and U+0085 unescaped inside strings; a line holding
    them is still one record (a synthesized prompt with one stopped a recipe run)."""
    texts = ["a\u2028b", "c\u2029d", "e\u0085f"]
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in texts),
        encoding="utf-8",
    )
    assert [record["prompt"] for _, record in read_prompt_records(path)] == texts


def test_a_batch_holds_at_most_max_batch_tokens_padded_tokens(tmp_path: Path) -> None:
    """LocalModel.load's max_batch_tokens bounds rows x (longest prompt + new tokens):
    the recipe raises it so that batches of long prompts keep their rows."""
    model_dir = build_word_chat_model(tmp_path / "m")
    prompts = [[VOCAB.index("code")] * 6 for _ in range(4)]  # 6 + 4 new tokens = 10 a row
    counts = {}
    for tokens in (0, 20, 40):
        local = LocalModel.load(model_dir, "cpu", "float32", 8, max_batch_tokens=tokens)
        _, stats = local.answer(prompts, 4)
        counts[tokens] = stats.batches
    assert counts == {0: 1, 20: 2, 40: 1}


def test_batches_group_prompts_by_length_up_to_their_size_and_padded_tokens() -> None:
    """length_batches: prompts sorted by length (then input order), a batch full at
    batch_size prompts or when its rows of longest prompt + new tokens would pass
    max_tokens."""
    assert length_batches([9, 3, 6, 3], 2, 1000, 4) == [[1, 3], [2, 0]]
    assert length_batches([6] * 5, 3, 1000, 4) == [[0, 1, 2], [3, 4]]
    # Rows of 6 + 4 = 10 tokens: two fit 20, three 30 (the new tokens count).
    assert length_batches([6] * 4, 8, 20, 4) == [[0, 1], [2, 3]]
    assert length_batches([6] * 4, 8, 30, 4) == [[0, 1, 2], [3]]
