"""Target-generated training data: greedy responses of the target to a prompt set.

DFlash drafters learn to predict what their target says, so the training rows are
prompt + the target's own greedy response (loss_mask 1 on the response only), written
as a ringtrain Arrow dataset (input_ids: list<int32>, loss_mask: list<uint8>).
Generation runs in left-padded batches of prompts of similar length with a static KV
cache (ringtrain.generate.local_model, the generator of ``ringtrain-data regenerate --local``;
2,048 prompts per batch on a GPU, ``--batch-size``, and at most 2^19 padded tokens,
``--max-batch-tokens``; every batch within 80% of the memory free when generation starts,
as ringtrain.generate.memory estimates it). Prompts are text
(``prompt``, encoded raw), token ids (``input_ids``) or chat ``messages``, rendered with
the target's chat template (``--chat-template-kwargs`` go to the template). A conversation
of several user turns is answered in rounds, each turn given the target's own earlier
answers (assistant turns of the input are replaced), and gives one row per assistant
turn (its history as the prompt, loss on that answer). ``--sampled-fraction F`` draws the
answers of that share of the conversations (spread evenly over them) at ``--temperature``
instead (seeded with ``--seed``): a drafter that learns only greedy answers accepts
little when the target is served sampling. Answers cut
at ``--max-new-tokens`` are counted and reported. Where every prompt record names its
``source`` (a mixture's records do), every row keeps it in a source column, as a prepared
mixture's rows do. The prompts can be carved from the local text
corpus of the toy recipe (train and eval splits never share text), so the recipe needs
no external data:

    python -m tools.recipes.regenerate --target models/toy --make-prompts 2000 --prompt-len 32 \\
        --prompts data/train-prompts.jsonl --output data/toy-train --max-new-tokens 96
    python -m tools.recipes.regenerate --target models/toy --make-prompts 32 --prompt-len 32 \\
        --split eval --prompts data/eval-prompts.jsonl --output data/toy-eval
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from ringtrain.cpu_math import settle_cpu_math
from ringtrain.data.corpus import carve_prompts, read_corpus
from ringtrain.data.sources import SOURCE
from ringtrain.data.writer import TokenFileWriter
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.local_model import DEVICES, LocalModel
from ringtrain.generate.memory import generation_budget
from ringtrain.generate.prompt_sets import (
    Conversation,
    PromptOptions,
    prompt_set_of_records,
    read_benchmark,
)
from ringtrain.generate.prompts import read_prompt_records
from ringtrain.generate.rounds import SampledShare, answer_in_rounds
from ringtrain.generate.sampling import TokenSampler

DATASET_FILE = "regenerated-00000.arrow"
DEFAULT_CORPUS_BYTES = 3_000_000


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[regenerate] {message}", file=sys.stderr, flush=True)


def corpus_bytes_of(target: Path) -> int:
    """The corpus size a toy target was trained on (toy_target.json), else the default."""
    info = target / "toy_target.json"
    if info.is_file():
        return int(json.loads(info.read_text())["preset"]["corpus_bytes"])
    return DEFAULT_CORPUS_BYTES


def write_dataset(
    directory: Path,
    prompts: list[list[int]],
    responses: list[list[int]],
    sources: list[str] | None = None,
) -> Path:
    """Rows prompt + response, loss_mask 1 on the response tokens; with ``sources`` (each
    row's), a source column as a prepared mixture has."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    input_ids = np.fromiter(
        (t for p, r in zip(prompts, responses, strict=True) for t in (*p, *r)),
        dtype=np.int32,
        count=int(offsets[-1]),
    )
    loss_mask = np.concatenate(
        [
            np.r_[np.zeros(len(p), np.uint8), np.ones(len(r), np.uint8)]
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    directory.mkdir(parents=True, exist_ok=True)
    names, source_ids = None, None
    if sources is not None:
        names, source_ids = np.unique(sources, return_inverse=True)
        names = names.tolist()
    with TokenFileWriter(directory / DATASET_FILE, names) as writer:
        writer.write(offsets, input_ids, loss_mask, source_ids)
    return writer.path


def record_sources(records: list[tuple[int, dict]]) -> list[str] | None:
    """The source each prompt record names (a mixture's records name theirs), or None
    unless every one names one."""
    names = [record.get(SOURCE) for _, record in records]
    return names if all(isinstance(name, str) for name in names) else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="local Hugging Face target directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="prompts JSONL (read, or written)")
    source.add_argument(
        "--benchmark",
        help="a built-in benchmark's prompts (e.g. humaneval), in ringtrain-eval's wording",
    )
    parser.add_argument("--limit", type=int, default=0, help="--benchmark: its first N prompts")
    parser.add_argument("--output", help="dataset directory to write (omit: only carve prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument(
        "--make-prompts",
        type=int,
        default=0,
        metavar="N",
        help="first carve N prompts from the local corpus into --prompts",
    )
    parser.add_argument("--prompt-len", type=int, default=32, help="tokens per carved prompt")
    parser.add_argument(
        "--split",
        default="train",
        choices=["train", "eval"],
        help="corpus part to carve from (the parts share no text)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sampled-fraction",
        type=float,
        default=0.0,
        help="share of the conversations whose answers are drawn at --temperature (0: none)",
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="of the drawn answers (default 1)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=0, help="prompts per batch (0: 2048 on GPU, 64 on CPU)"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=0,
        help="padded tokens per batch at most: rows x (longest prompt + new tokens), which "
        "bounds the cache and the prompt forward's attention scores (0: 2^19)",
    )
    parser.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        default={},
        help='JSON object for the chat template of "messages" prompts, e.g. '
        "'{\"enable_thinking\": false}'",
    )
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument(
        "--dtype", default="auto", help="auto (bf16 on GPU, float32 on CPU), bfloat16, float32"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    return parser.parse_args(argv)


def make_prompts(args: argparse.Namespace, target: Path) -> None:
    """Carve prompts from the corpus with the target's tokenizer; write them as JSONL."""
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    documents = read_corpus(corpus_bytes_of(target))
    prompts = carve_prompts(
        documents,
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        args.make_prompts,
        args.prompt_len,
        args.split,
        args.seed,
    )
    path = Path(args.prompts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for prompt in prompts:
            prompt["prompt"] = tokenizer.decode(prompt["input_ids"])
            out.write(json.dumps(prompt) + "\n")
    log(f"wrote {len(prompts)} {args.split} prompts of {args.prompt_len} tokens to {path}")


def read_conversations(
    args: argparse.Namespace, renderer: ChatRenderer, vocab_size: int
) -> tuple[list[Conversation], list[str] | None]:
    """The conversations to answer, a prompts file's or a benchmark's, and the source each
    names (None for a benchmark, or unless every record of the file names one)."""
    if args.prompts:
        path = Path(args.prompts).expanduser()
        records = read_prompt_records(path)
        options = PromptOptions(renderer, vocab_size, raw_prompts=True)
        return prompt_set_of_records(records, path, options).conversations, record_sources(records)
    options = PromptOptions(renderer, vocab_size, limit=args.limit)
    return read_benchmark(args.benchmark, options).conversations, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settle_cpu_math()
    target = Path(args.target).expanduser()
    if args.make_prompts:
        make_prompts(args, target)
    if not args.output:
        return 0
    local = LocalModel.load(target, args.device, args.dtype, args.batch_size, args.max_batch_tokens)
    renderer = ChatRenderer(local.tokenizer, args.chat_template_kwargs)
    conversations, sources = read_conversations(args, renderer, local.vocab_size)
    sampled = None
    if args.sampled_fraction > 0:
        sampler = TokenSampler.seeded(args.temperature, 1.0, args.seed, local.model.device)
        sampled = SampledShare.spread(sampler, len(conversations), args.sampled_fraction)
    turns = sum(c.turns for c in conversations)
    with tqdm(total=turns, desc="regenerate", unit="turn", file=sys.stderr) as bar:
        prompts, answers, owners, stats = answer_in_rounds(
            local, conversations, renderer, args.max_new_tokens, bar.update,
            memory_budget=generation_budget(local.model.device), sampled=sampled,
        )  # fmt: skip
    responses = [answer.tokens for answer in answers]
    truncated = sum(answer.truncated for answer in answers)
    log(
        f"{stats.new_tokens} tokens in {stats.seconds:.1f} s ({stats.tokens_per_s:,.0f} tokens/s); "
        f"{truncated} of {len(answers)} answers cut at --max-new-tokens {args.max_new_tokens}"
    )
    row_sources = None if sources is None else [sources[i] for i in owners]
    path = write_dataset(Path(args.output), prompts, responses, row_sources)
    log(
        f"wrote {len(prompts)} rows ({stats.new_tokens} response tokens) to {path}: "
        f"{len(conversations)} conversations"
    )
    summary = {
        "conversations": len(conversations),
        "prompts": len(prompts),
        "new_tokens": stats.new_tokens,
        "seconds": round(stats.seconds, 2),
        "tokens_per_s": round(stats.tokens_per_s),
        "truncated": truncated,
        "sampled_conversations": 0 if sampled is None else len(sampled.conversations),
    }
    (Path(args.output) / "regenerate.json").write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
