"""Overlap of training data with evaluation prompts: shared runs of n words.

Nothing derived from an evaluation set may enter training, or the acceptance measured
on it says nothing about unseen traffic. A training record is flagged when one of its
messages shares a run of ``n`` consecutive words (13 by default, lower-cased, punctuation
ignored) with an evaluation prompt; an evaluation prompt shorter than ``n`` words but of
at least ``MIN_SHORT_WORDS`` counts as one run of its own length. Evaluation prompts come
from the built-in benchmarks (``humaneval``, ``mt-bench``: both turns) of the installed
packages, or from a JSONL prompts file (``turns``, ``messages``, ``prompt`` or
``question`` on each line).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ringtrain.data.chat import conversation_messages, decode_record
from ringtrain.data.errors import DatasetError
from ringtrain.data.synth_filters import words

DEFAULT_NGRAM = 13
MIN_SHORT_WORDS = 8
BENCHMARKS = ("humaneval", "mt-bench")
PROMPT_FIELDS = ("turns", "messages", "prompt", "question")


@dataclass(frozen=True)
class EvaluationText:
    """One evaluation prompt (or turn) and where it comes from."""

    label: str
    text: str


@dataclass(frozen=True)
class Overlap:
    """A training record that shares a run of words with an evaluation prompt."""

    where: str  # file:line of the training record
    label: str  # the evaluation prompt's
    words: str  # the run shared


def _benchmark_texts(name: str) -> list[EvaluationText]:
    """The prompts of a built-in benchmark, from its installed package."""
    from ringtrain.generate import prompt_sets  # transformers: only for built-in benchmarks
    from ringtrain.generate.prompts import PromptFileError

    try:
        if name == "humaneval":
            problems = prompt_sets.humaneval_problems()
            return [EvaluationText(f"humaneval {p['task_id']}", p["prompt"]) for p in problems]
        path = prompt_sets.mtbench_path()
    except PromptFileError as exc:
        raise DatasetError(str(exc)) from None
    texts = []
    with path.open(encoding="utf-8") as lines:
        for question in (json.loads(line) for line in lines if line.strip()):
            for turn, text in enumerate(question["turns"], start=1):
                label = f"mt-bench {question['question_id']} turn {turn}"
                texts.append(EvaluationText(label, text))
    return texts


def _record_texts(record: object, where: str) -> list[str]:
    """The prompt texts of one line of a prompts file."""
    if isinstance(record, dict):
        for field in PROMPT_FIELDS:
            value = record.get(field)
            if isinstance(value, str):
                return [value]
            if isinstance(value, list):  # turns: texts; messages: {"role", "content"}
                texts = [v.get("content") if isinstance(v, dict) else v for v in value]
                return [text for text in texts if isinstance(text, str)]
    raise DatasetError(f"{where}: expected an object with {', '.join(PROMPT_FIELDS)}")


def _file_texts(path: Path) -> list[EvaluationText]:
    """The prompts of a JSONL prompts file."""
    if not path.is_file():
        raise DatasetError(
            f"--against {path}: neither a built-in benchmark ({', '.join(BENCHMARKS)}) nor a file"
        )
    texts = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                where = f"{path}:{number}"
                record = decode_record(line, where)
                texts += [EvaluationText(where, t) for t in _record_texts(record, where)]
    return texts


def evaluation_texts(against: str) -> list[EvaluationText]:
    """The prompts of a built-in benchmark by name, or of a prompts file by path."""
    if against in BENCHMARKS:
        return _benchmark_texts(against)
    return _file_texts(Path(against).expanduser())


class NgramIndex:
    """The word runs of evaluation prompts, each with the label of a prompt holding it."""

    def __init__(self, texts: Iterable[EvaluationText], n: int = DEFAULT_NGRAM) -> None:
        if n < 1:
            raise DatasetError(f"--ngram must be at least 1, not {n}")
        self.n = n
        self.runs: dict[tuple[str, ...], str] = {}
        for item in texts:
            for run in self._runs(words(item.text)):
                self.runs.setdefault(run, item.label)
        self.lengths = sorted({len(run) for run in self.runs})

    def _runs(self, text_words: list[str]) -> Iterator[tuple[str, ...]]:
        if len(text_words) >= self.n:
            for i in range(len(text_words) - self.n + 1):
                yield tuple(text_words[i : i + self.n])
        elif len(text_words) >= min(self.n, MIN_SHORT_WORDS):
            yield tuple(text_words)

    def find(self, text: str) -> tuple[str, str] | None:
        """(label, shared words) of the first run of ``text`` an evaluation prompt holds."""
        text_words = words(text)
        for length in self.lengths:
            for i in range(len(text_words) - length + 1):
                label = self.runs.get(tuple(text_words[i : i + length]))
                if label is not None:
                    return label, " ".join(text_words[i : i + length])
        return None


def find_overlaps(train: Path, index: NgramIndex) -> tuple[int, list[Overlap]]:
    """The number of records in a chat JSONL file and those that overlap ``index``."""
    if not train.is_file():
        raise DatasetError(f"--train {train}: no such file")
    records, overlaps = 0, []
    with train.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            records += 1
            where = f"{train}:{number}"
            messages = conversation_messages(decode_record(line, where), where)
            for message in messages:
                found = index.find(message["content"])
                if found is not None:
                    overlaps.append(Overlap(where, *found))
                    break
    return records, overlaps
