"""Temperature / top-p sampling in batched generation: the nucleus, the draws' distribution,
seeding, and sampled decoding of a real tiny model (own cache and transformers' generate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ringtrain.generate.greedy import DecodeOptions, greedy_answers
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.sampling import TokenSampler
from tests.helpers.word_chat_model import VOCAB, build_word_chat_model, next_token_logits

pytestmark = pytest.mark.usefixtures("one_thread")


def test_top_p_keeps_the_smallest_head_reaching_p_renormalised() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    sampler = TokenSampler.seeded(1.0, 0.8, 0, "cpu")
    assert torch.allclose(sampler.probabilities(logits), torch.tensor([[0.625, 0.375, 0, 0]]))
    wider = TokenSampler.seeded(1.0, 0.81, 0, "cpu").probabilities(logits)
    assert torch.allclose(wider, torch.tensor([[0.5, 0.3, 0.15, 0]]) / 0.95)
    hotter = TokenSampler.seeded(2.0, 1.0, 0, "cpu").probabilities(logits)
    assert torch.allclose(hotter, torch.softmax(logits / 2, dim=-1))


def test_top_p_stops_at_the_token_whose_mass_reaches_p_exactly() -> None:
    """Four equally likely tokens (0.25 each, exact in float32) at top_p 0.5: the first two
    reach 0.5, so the nucleus is those two, the third left out."""
    probs = TokenSampler.seeded(1.0, 0.5, 0, "cpu").probabilities(torch.zeros(1, 4))
    assert sorted(probs[0].tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_draws_follow_the_probabilities_and_repeat_with_the_seed() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0]).expand(40_000, 5)
    sampler = TokenSampler.seeded(0.7, 1.0, 11, "cpu")
    drawn = sampler.sample(logits)
    frequencies = torch.bincount(drawn, minlength=5).double() / len(drawn)
    expected = torch.softmax(logits[0].double() / 0.7, dim=-1)
    sigma = (expected * (1 - expected) / len(drawn)).sqrt()
    assert ((frequencies - expected).abs() <= 4 * sigma + 1e-9).all(), (frequencies, expected)
    assert torch.equal(TokenSampler.seeded(0.7, 1.0, 11, "cpu").sample(logits), drawn)
    assert not torch.equal(TokenSampler.seeded(0.7, 1.0, 12, "cpu").sample(logits), drawn)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="temperature"):
        TokenSampler.seeded(0.0, 1.0, 0, "cpu")
    with pytest.raises(ValueError, match="top_p"):
        TokenSampler.seeded(1.0, 0.0, 0, "cpu")
    with pytest.raises(ValueError, match="top_p"):
        TokenSampler.seeded(1.0, 1.5, 0, "cpu")


@pytest.fixture(scope="module")
def word_model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    directory = build_word_chat_model(tmp_path_factory.mktemp("word-model"))
    return LocalModel.load(directory, "cpu", "float32", batch_size=2000)


def _first_tokens(
    model: LocalModel, sampler: TokenSampler | None, rows: int, cache: str = "own"
) -> torch.Tensor:
    prompt = [VOCAB.index("<|im_start|>"), VOCAB.index("user")]
    answers, _ = greedy_answers(
        model.model,
        [prompt] * rows,
        1,
        model.stop_ids,
        pad_id=model.pad_id,
        batch_size=model.batch_size,
        options=DecodeOptions(cache=cache),
        sampler=sampler,
    )
    return torch.tensor([answer.tokens[0] for answer in answers])


# "static": transformers' generate, as for targets the own cache cannot hold.
@pytest.mark.parametrize("cache", ["own", "static"])
def test_sampled_decoding_draws_the_models_next_token_distribution(
    word_model: LocalModel, cache: str
) -> None:
    """The model's next-token distribution is known exactly (a bigram chain), so the first
    tokens drawn over many identical prompts must match it, on both decoding paths."""
    rows = 2000
    drawn = _first_tokens(word_model, TokenSampler.seeded(1.0, 1.0, 3, "cpu"), rows, cache)
    expected = torch.softmax(next_token_logits().double(), dim=-1)
    frequencies = torch.bincount(drawn, minlength=len(VOCAB)).double() / rows
    sigma = (expected * (1 - expected) / rows).sqrt()
    assert ((frequencies - expected).abs() <= 4 * sigma + 1e-9).all()
    again = _first_tokens(word_model, TokenSampler.seeded(1.0, 1.0, 3, "cpu"), rows, cache)
    assert torch.equal(again, drawn)
    nucleus = _first_tokens(word_model, TokenSampler.seeded(1.0, 0.01, 3, "cpu"), 64, cache)
    assert torch.equal(nucleus, _first_tokens(word_model, None, 64, cache))


@pytest.mark.gpu
def test_sampled_decoding_on_cuda_graphs_repeats_with_the_seed(tmp_path: Path) -> None:
    """On CUDA the decode step is a replayed graph: the registered generator must draw anew
    at every replay (rows differ, later tokens vary) and repeat with the seed."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = LocalModel.load(build_word_chat_model(tmp_path / "m"), "cuda", "float32", 256)
    prompt = [VOCAB.index("<|im_start|>"), VOCAB.index("user")]

    def draw(seed: int) -> list[list[int]]:
        answers, _ = model.answer(
            [prompt] * 256, 24, sampler=TokenSampler.seeded(1.0, 1.0, seed, "cuda")
        )
        return [answer.tokens for answer in answers]

    first = draw(5)
    assert draw(5) == first
    assert len({tuple(tokens) for tokens in first}) > 128
    later = [tokens[3] for tokens in first if len(tokens) > 4]
    assert len(set(later)) > 5
