"""The built-in tiny target: a random-initialised Qwen3.5-style model written to disk.

Used by the embedded default run and by tests. ``hybrid=True`` writes Gated DeltaNet
``linear_attention`` layers interleaved 3:1 with ``full_attention`` layers (Qwen3.5
text model); ``hybrid=False`` a dense Qwen3. The directory also gets a byte-level
tokenizer built in code (one token per byte, Qwen-style special tokens, a mask token
with the last id of the vocabulary and a Qwen-style chat template), so it loads with
AutoConfig / AutoTokenizer from local files like a downloaded model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PreTrainedTokenizerFast

FULL_ATTENTION_INTERVAL = 4  # 3 linear-attention layers, then 1 full-attention layer
NUM_BYTE_TOKENS = 256
# Special tokens follow the byte tokens: ids 256.. in this order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
PAD_TOKEN_ID = NUM_BYTE_TOKENS + SPECIAL_TOKENS.index("<|endoftext|>")
EOS_TOKEN_ID = NUM_BYTE_TOKENS + SPECIAL_TOKENS.index("<|im_end|>")
MASK_TOKEN = "<|mask|>"  # takes the last id of the vocabulary
MIN_VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS) + 1
# Qwen-style ChatML; {% generation %} marks assistant tokens for assistant masks.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tiny_config(
    *, vocab_size: int, hidden_size: int, num_layers: int, hybrid: bool
) -> dict[str, object]:
    """The config.json contents of the tiny target."""
    heads = max(2, hidden_size // 16)
    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": 16,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
    }
    if not hybrid:
        return {**common, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    return {
        **common,
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "layer_types": [
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
            for i in range(num_layers)
        ],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": max(1, heads // 2),
        "linear_num_value_heads": heads,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }


def byte_symbols() -> list[str]:
    """The byte-level pre-tokenizer's symbol for each byte value 0..255, in byte order.

    Printable Latin-1 bytes stand for themselves; the others are shifted to 256 and up.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    symbols = []
    shifted = 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer of exactly ``vocab_size`` ids (one token per byte).

    Ids: 0..255 the byte values, then SPECIAL_TOKENS, then unreachable reserved fillers, and the
    mask token at ``vocab_size - 1``.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"tiny target vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}"
        )
    tokens = byte_symbols() + list(SPECIAL_TOKENS)
    tokens += [f"<|reserved_{i}|>" for i in range(vocab_size - len(tokens) - 1)]
    tokens.append(MASK_TOKEN)
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([*SPECIAL_TOKENS, MASK_TOKEN])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        mask_token=MASK_TOKEN,
        model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_target(
    directory: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 8,
    hybrid: bool = True,
) -> Path:
    """Write a random-initialised tiny target (config, weights, tokenizer) to ``directory``.

    Deterministic for a given seed. Returns the directory.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    values = tiny_config(
        vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, hybrid=hybrid
    )
    config = CONFIG_MAPPING[values["model_type"]].from_dict(values)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # A trained model's LM head can give logits of several units; the default
        # 0.02-std initialisation caps them near zero, which no drafter can learn from in a
        # short run. Unit-norm rows: logits of unit spread, up to about sqrt(hidden).
        head_std = 1.0 / hidden_size**0.5
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, head_std)
            model.get_output_embeddings().weight.normal_(0.0, head_std)
    save_file(model.state_dict(), str(directory / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(directory)
    tiny_tokenizer(vocab_size).save_pretrained(directory)
    return directory
