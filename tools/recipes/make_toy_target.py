"""Train a small target language model on local text, in minutes on CPU.

The model (Qwen3 architecture, or with --hybrid a Qwen3.5-style mix of Gated DeltaNet
and full-attention layers) learns from the Python standard library's own sources, docs
and licence (ringtrain.data.corpus; nothing is downloaded), with a byte-level BPE
tokenizer trained on the same text. The output is a Hugging Face directory (config.json,
model.safetensors, tokenizer files with a <|mask|> token as the last id for the
drafter) that ringtrain loads as a target; toy_target.json beside it records how it was
made. Deterministic for a seed and a step count: --minutes picks the step count from the
measured speed of a few throwaway steps (after warm-up steps, which on a GPU include
kernel selection and are slow) and logs it, and --steps N repeats a run exactly.

    python -m tools.recipes.make_toy_target --output models/toy --minutes 10
    python -m tools.recipes.make_toy_target --output /tmp/tiny --tiny      # seconds, for tests
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PreTrainedTokenizerFast

from ringtrain.cpu_math import settle_cpu_math
from ringtrain.data.corpus import read_corpus
from ringtrain.target.tiny import tiny_config

END_OF_TEXT = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [END_OF_TEXT, "<|im_start|>", "<|im_end|>"]
WARMUP_STEPS = 3  # untimed: first-use costs (CUDA context, kernel selection, allocator)
CALIBRATION_STEPS = 8  # timed, on throwaway copies of the model and optimiser


@dataclass(frozen=True)
class Preset:
    """Sizes of one toy target and its training."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    corpus_bytes: int
    lr: float


PRESETS = {
    "toy": Preset(
        vocab_size=2048,
        hidden_size=256,
        num_layers=6,
        num_heads=4,
        seq_len=128,
        batch_size=16,
        corpus_bytes=3_000_000,
        lr=3e-3,
    ),
    "tiny": Preset(
        vocab_size=400,
        hidden_size=64,
        num_layers=6,
        num_heads=2,
        seq_len=64,
        batch_size=8,
        corpus_bytes=200_000,
        lr=3e-3,
    ),
}


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[make_toy_target] {message}", file=sys.stderr, flush=True)


def train_tokenizer(documents: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of ``vocab_size`` ids at most; the mask token takes the last id."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(documents, trainer=trainer)
    backend.add_special_tokens([MASK_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        mask_token=MASK_TOKEN,
        model_max_length=32768,
    )


def encode_corpus(tokenizer: PreTrainedTokenizerFast, documents: list[str]) -> torch.Tensor:
    """One token stream: every document followed by <|endoftext|>."""
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    encoded = tokenizer.backend_tokenizer.encode_batch(documents, add_special_tokens=False)
    stream = [token for item in encoded for token in [*item.ids, eos]]
    return torch.tensor(stream, dtype=torch.long)


def model_config(preset: Preset, vocab_size: int, eos_id: int, hybrid: bool):
    """The HF config of the toy target (Qwen3, or Qwen3.5 text with --hybrid)."""
    values = tiny_config(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        num_layers=preset.num_layers,
        hybrid=hybrid,
    )
    values.update(
        num_attention_heads=preset.num_heads,
        num_key_value_heads=max(1, preset.num_heads // 2),
        head_dim=preset.hidden_size // preset.num_heads,
        intermediate_size=2 * preset.hidden_size,
        max_position_embeddings=4096,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


def learning_rate(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_windows(
    stream: torch.Tensor, batch: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``batch`` random windows of ``length`` tokens from the stream."""
    starts = torch.randint(0, len(stream) - length, (batch,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def _optimizer(model: torch.nn.Module, preset: Preset) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.1)


def _train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor
) -> torch.Tensor:
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate_steps(
    model: torch.nn.Module,
    stream: torch.Tensor,
    preset: Preset,
    minutes: float,
    device: torch.device,
) -> int:
    """The step count that fits in ``minutes``, timed on copies (the model is untouched)."""
    trial = copy.deepcopy(model).train()
    optimizer = _optimizer(trial, preset)
    generator = torch.Generator().manual_seed(12345)
    started = 0.0
    for step in range(WARMUP_STEPS + CALIBRATION_STEPS):
        if step == WARMUP_STEPS:
            _sync(device)
            started = time.perf_counter()
        batch = sample_windows(stream, preset.batch_size, preset.seq_len, generator).to(device)
        _train_step(trial, optimizer, batch)
    _sync(device)
    per_step = (time.perf_counter() - started) / CALIBRATION_STEPS
    return max(1, int(minutes * 60 / per_step))


def train(
    model: torch.nn.Module,
    stream: torch.Tensor,
    preset: Preset,
    steps: int,
    seed: int,
    device: torch.device,
) -> list[float]:
    """Train for ``steps`` steps with warm-up and cosine decay; returns the losses."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = _optimizer(model, preset)
    model.train()
    losses: list[torch.Tensor] = []  # on the device: no sync per step
    started = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, preset.lr)
        batch = sample_windows(stream, preset.batch_size, preset.seq_len, generator).to(device)
        losses.append(_train_step(model, optimizer, batch))
        done = step + 1
        if done % max(1, steps // 20) == 0 or done == steps:
            elapsed = time.perf_counter() - started
            tokens = done * preset.batch_size * preset.seq_len
            log(
                f"step {done}/{steps} loss {float(losses[-1]):.3f} "
                f"{tokens / elapsed:.0f} tokens/s {elapsed:.0f} s"
            )
    model.eval()
    return torch.stack(losses).tolist()


def greedy_sample(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, prompt: str, device: torch.device
) -> tuple[str, float]:
    """A greedy continuation of ``prompt`` and its share of distinct tokens (1.0 = no repeats)."""
    ids = torch.tensor([tokenizer.encode(prompt)], device=device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=64,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    return tokenizer.decode(new), len(set(new)) / max(1, len(new))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="directory to write the target into")
    parser.add_argument("--hybrid", action="store_true", help="Gated DeltaNet + attention layers")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    parser.add_argument(
        "--steps", type=int, default=0, help="exact step count (overrides --minutes)"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny preset that trains in seconds")
    parser.add_argument(
        "--corpus-mb",
        type=float,
        default=0.0,
        help="megabytes of corpus text to train on (default: the preset's; more text, "
        "fewer passes over it in the same time, less memorised)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (default 1: the same float results on every machine, and no "
        "slow-down when other processes share the cores)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = PRESETS["tiny" if args.tiny else "toy"]
    if args.corpus_mb:
        preset = replace(preset, corpus_bytes=int(args.corpus_mb * 1e6))
    if args.tiny and not args.steps:
        args.steps = 30
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    torch.set_num_threads(args.threads)
    settle_cpu_math()
    output = Path(args.output)
    documents = read_corpus(preset.corpus_bytes)
    log(f"corpus: {len(documents)} files, {sum(map(len, documents)) / 1e6:.1f} MB of text")
    tokenizer = train_tokenizer(documents, preset.vocab_size)
    stream = encode_corpus(tokenizer, documents)
    vocab_size = len(tokenizer)
    log(f"tokenizer: {vocab_size} ids, mask id {tokenizer.mask_token_id}; {len(stream)} tokens")
    eos_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = model_config(preset, vocab_size, eos_id, args.hybrid)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {config.model_type}, {preset.num_layers} layers, {params / 1e6:.1f} M params")
    steps = args.steps
    if not steps:
        steps = calibrate_steps(model, stream, preset, args.minutes, device)
        log(
            f"training {steps} steps (~{args.minutes:g} min); "
            f"pass --steps {steps} to repeat exactly"
        )
    losses = train(model, stream, preset, steps, args.seed, device)
    sample, distinct = greedy_sample(model, tokenizer, "def ", device)
    log(f"greedy sample after 'def ' ({distinct:.0%} distinct tokens): {sample!r}")
    output.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(output)
    tokenizer.save_pretrained(output)
    info = {
        "preset": asdict(preset),
        "hybrid": args.hybrid,
        "seed": args.seed,
        "steps": steps,
        "minutes": None if args.steps else args.minutes,
        "corpus_mb": args.corpus_mb,
        "device": device.type,
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "mask_token_id": tokenizer.mask_token_id,
        "greedy_distinct_share": distinct,
    }
    (output / "toy_target.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"wrote {output} (final loss {info['final_loss']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
