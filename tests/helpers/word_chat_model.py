"""A tiny chat model over a vocabulary of words whose next-token distribution is set by hand.

Its one decoder layer writes nothing into the residual stream (output projections are
zero) and each token's embedding is its own axis, so the logits at a position depend on
that position's token only, through one column of the LM head: the model is a bigram
chain that a test can reason about. After any token it writes content words with
Zipf-like probabilities (steeper ones make near-duplicate prompts common) and ends its
turn with ``<|im_end|>`` with probability about ``1 / MEAN_WORDS``; it never writes the
other special tokens nor the role names. A word-level tokenizer and a ChatML template
come with it; ``with_template=False`` leaves the template out.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROLES = ["system", "user", "assistant"]
WORDS = [
    "write",
    "explain",
    "how",
    "why",
    "what",
    "the",
    "a",
    "poem",
    "story",
    "about",
    "sea",
    "rain",
    "train",
    "code",
    "list",
    "numbers",
    "sort",
    "python",
    "function",
    "short",
    "long",
    "please",
    "give",
    "me",
    "three",
]
VOCAB = SPECIALS + ROLES + WORDS
END_ID = VOCAB.index("<|im_end|>")
PAD_ID = VOCAB.index("<|endoftext|>")
HIDDEN = 64
MEAN_WORDS = 7
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def next_token_logits(skew: float = 1.2) -> torch.Tensor:
    """The logits [V] of the token after any token: word k (from 0) is 1 / (k + 1) ** skew
    as likely as the first word."""
    logits = torch.full((len(VOCAB),), -30.0)
    zipf = torch.tensor([-skew * math.log(rank + 1) for rank in range(len(WORDS))])
    first = len(SPECIALS) + len(ROLES)
    logits[first:] = zipf
    words_mass = float(zipf.exp().sum())
    logits[END_ID] = math.log(words_mass / (MEAN_WORDS - 1))
    return logits


def _tokenizer(with_template: bool) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    if with_template:
        tokenizer.chat_template = TEMPLATE
    return tokenizer


def build_word_chat_model(directory: Path, with_template: bool = True, skew: float = 1.2) -> Path:
    """Write the model and its tokenizer to ``directory`` (save_pretrained); returns it.
    A larger ``skew`` makes the first words likelier, so written prompts repeat more."""
    config = Qwen3Config(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=END_ID,
        pad_token_id=PAD_ID,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding = model.get_input_embeddings().weight
        embedding.zero_()
        embedding[:, : len(VOCAB)] = torch.eye(len(VOCAB))
        # The final norm scales a one-hot embedding to sqrt(HIDDEN) on its axis.
        head = model.get_output_embeddings().weight
        head.zero_()
        head[:, : len(VOCAB)] = next_token_logits(skew)[:, None] / math.sqrt(HIDDEN)
    model.save_pretrained(directory)
    _tokenizer(with_template).save_pretrained(directory)
    return directory
