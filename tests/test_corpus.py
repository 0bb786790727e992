"""The toy recipe's corpus: the licence first, the documentation topics second, then the
library's sources in sorted order, its test, site-packages and cache directories left out;
an undecodable file read with replacement characters, an empty one skipped; the text
capped at exactly the size asked for; prompts carved reproducibly for a seed, each at a
line start, the train part's never from the eval part's text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ringtrain.data import corpus
from ringtrain.data.corpus import carve_prompts, corpus_files, read_corpus

SOURCES = [f"mod_{i:02d}.py" for i in range(30)] + ["pkg/__init__.py", "pkg/alpha.py"]
SKIPPED = [
    "test/test_mod.py", "tests/test_other.py", "idle_test/test_idle.py",
    "site-packages/vendored.py", "__pycache__/cached.py", "encodings/table.py",
]  # fmt: skip


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A standard library of real files at a temporary location, made the running one."""
    root = tmp_path / "lib" / "python3"
    names = SOURCES + SKIPPED
    random.Random(0).shuffle(names)  # created in neither sorted nor reverse-sorted order
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\nvalue = {name!r}\n")
    (root / "LICENSE.txt").write_text("A licence.\n")
    (root / "pydoc_data").mkdir()
    (root / "pydoc_data" / "topics.py").write_text("topics = {}\n")
    monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(root)})
    return root


def test_the_licence_and_topics_come_first_then_the_sources_sorted_without_skipped_dirs(
    library: Path,
) -> None:
    files = corpus_files()
    assert files[0] == library / "LICENSE.txt"
    assert files[1] == library / "pydoc_data" / "topics.py"
    assert files[2:] == sorted(library / name for name in SOURCES)
    assert len(set(files)) == len(files)


def test_an_undecodable_file_is_read_with_replacements_and_an_empty_one_skipped(
    library: Path,
) -> None:
    (library / "mod_00.py").write_bytes(b"name = '\xff\xfe'\n")
    (library / "mod_01.py").write_text("  \n\n")
    documents = read_corpus(1_000_000)
    assert documents[2] == "name = '\ufffd\ufffd'\n"
    kept = [library / "LICENSE.txt", library / "pydoc_data" / "topics.py"] + [
        library / name for name in sorted(SOURCES) if name not in {"mod_00.py", "mod_01.py"}
    ]
    assert documents[3:] == [path.read_text() for path in kept[2:]]
    assert documents[:2] == ["A licence.\n", "topics = {}\n"]


def test_the_text_is_capped_at_exactly_the_size_asked_for(library: Path) -> None:
    whole = read_corpus(1_000_000)
    first_two = len(whole[0]) + len(whole[1])
    exact = read_corpus(first_two)
    assert exact == whole[:2]
    cut = read_corpus(first_two + 5)
    assert cut == [*whole[:2], whole[2][:5]]
    assert sum(map(len, cut)) == first_two + 5


def test_the_real_library_gives_the_same_corpus_on_every_read() -> None:
    files = corpus_files()
    assert files == corpus_files()
    assert all(path.suffix == ".py" for path in files[2:])
    documents = read_corpus(50_000)
    assert sum(map(len, documents)) == 50_000
    assert documents == read_corpus(50_000)


def encode(text: str) -> list[int]:
    return [ord(char) for char in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


DOCUMENTS = ["\n".join(f"line {d:02d}-{i:04d} of the text" for i in range(400)) for d in range(5)]


def test_prompts_are_the_same_for_a_seed_and_differ_between_seeds() -> None:
    def carve(seed: int) -> list[dict]:
        return carve_prompts(DOCUMENTS, encode, count=20, length=24, split="train", seed=seed)

    assert carve(3) == carve(3)
    assert carve(3) != carve(4)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_prompts_start_at_a_line_start_within_their_part(split: str) -> None:
    text = "\n".join(DOCUMENTS)
    boundary = int(0.9 * len(text))
    prompts = carve_prompts(DOCUMENTS, encode, count=200, length=24, split=split, seed=1)
    assert len(prompts) == 200
    for prompt in prompts:
        assert len(prompt["input_ids"]) == 24
        piece = decode(prompt["input_ids"])
        start = text.find(piece)
        assert start > 0 and text[start - 1] == "\n" and piece[0] != "\n"
        if split == "train":
            assert start + len(piece) <= boundary
        else:
            assert start >= boundary


def test_an_unknown_split_or_a_too_short_part_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of train, eval"):
        carve_prompts(DOCUMENTS, encode, count=1, length=8, split="test", seed=0)
    with pytest.raises(ValueError, match="too short"):
        carve_prompts(["short\ntext\n"], encode, count=1, length=8, split="eval", seed=0)
