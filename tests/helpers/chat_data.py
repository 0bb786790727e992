"""A small Qwen-style tokenizer and chat data for the dataset-preparation tests."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# The shape of Qwen2.5's template: a default system turn, <|im_start|>role\n...<|im_end|>\n.
QWEN_STYLE_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a helpful assistant answers questions about trains and rings",
    "what is the capital of france? paris is the capital of france.",
    "write a short poem about the sea and the wind",
    "you are a helpful assistant. system user assistant",
]
CONVERSATIONS = [
    {
        "messages": [
            {"role": "user", "content": "what is the capital of france?"},
            {"role": "assistant", "content": "paris is the capital of france."},
        ]
    },
    {
        "conversations": [
            {"from": "system", "value": "you are a poet."},
            {"from": "human", "value": "write a short poem about the sea"},
            {"from": "gpt", "value": "the sea and the wind, the quick brown fox"},
            {"from": "human", "value": "and about trains?"},
            {"from": "gpt", "value": "trains and rings jump over the lazy dog"},
        ]
    },
    {"messages": [{"role": "user", "content": "hello there"}]},  # nothing to supervise
]
ASSISTANT_TEXTS = [
    ["paris is the capital of france."],
    ["the sea and the wind, the quick brown fox", "trains and rings jump over the lazy dog"],
]


def write_tokenizer(directory: Path) -> Path:
    """A byte-level BPE tokenizer trained on SENTENCES, with the Qwen-style template."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    model.train_from_iterator(SENTENCES, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def write_chats(path: Path) -> Path:
    """CONVERSATIONS as chat JSONL (with a trailing blank line)."""
    path.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n\n")
    return path
