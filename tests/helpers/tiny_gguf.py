"""A tiny llama chat model written as a GGUF file with the gguf package's writer.

llama.cpp's tensor names and metadata keys: 2 layers, hidden 64, float16 matrices and
float32 norms, and a byte-level BPE tokenizer (the tiny target's byte symbols, a few merges,
ChatML control tokens and the tiny target's chat template). ``tiny_tensors`` gives the
weights, so a test can write a file with some of them removed or reshaped.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ringtrain.target.tiny import CHAT_TEMPLATE, byte_symbols

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 128
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = byte_symbols() + [merge.replace(" ", "") for merge in MERGES] + CONTROL_TOKENS
ENDOFTEXT, IM_START, IM_END = (TOKENS.index(token) for token in CONTROL_TOKENS)
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp's token types


def tiny_tensors(tied: bool) -> dict[str, np.ndarray]:
    """Random llama weights under llama.cpp's names, shaped (out, in) as numpy sees them."""
    rng = np.random.default_rng(0)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / cols**0.5).astype(np.float16)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)

    tensors = {"token_embd.weight": matrix(len(TOKENS), HIDDEN)}
    for layer in range(LAYERS):
        tensors |= {
            f"blk.{layer}.attn_norm.weight": norm(),
            f"blk.{layer}.attn_q.weight": matrix(HEADS * HEAD_DIM, HIDDEN),
            f"blk.{layer}.attn_k.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            f"blk.{layer}.attn_v.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            f"blk.{layer}.attn_output.weight": matrix(HIDDEN, HEADS * HEAD_DIM),
            f"blk.{layer}.ffn_norm.weight": norm(),
            f"blk.{layer}.ffn_gate.weight": matrix(FFN, HIDDEN),
            f"blk.{layer}.ffn_up.weight": matrix(FFN, HIDDEN),
            f"blk.{layer}.ffn_down.weight": matrix(HIDDEN, FFN),
        }
    tensors["output_norm.weight"] = norm()
    if not tied:
        tensors["output.weight"] = matrix(len(TOKENS), HIDDEN)
    return tensors


def write_tiny_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    tied: bool = True,
    eos: int = IM_END,
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """A tiny llama chat model as a GGUF file; no output.weight when ``tied``; ``tensors``
    in place of ``tiny_tensors(tied)``."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny chat llama")
    writer.add_context_length(256)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types(
        [TOKEN_CONTROL if token in CONTROL_TOKENS else TOKEN_NORMAL for token in TOKENS]
    )
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(IM_START)
    writer.add_eos_token_id(eos)
    if eos != IM_END:
        writer.add_eot_token_id(IM_END)
    writer.add_pad_token_id(ENDOFTEXT)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in (tiny_tensors(tied) if tensors is None else tensors).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
