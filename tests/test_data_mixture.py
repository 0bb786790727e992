"""Data mixtures: `prepare --mixture` draws exact counts per source (by rows or weight),
deterministically, keeps every row's source in the dataset, and `inspect` counts them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data.mixture import Mixture, Source, plan_counts, write_mixture
from ringtrain.data.sources import source_counts


def _chats(path: Path, tag: str, count: int) -> Path:
    """``count`` conversations whose texts say which file and record they are."""
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"{tag} question {i}: the quick brown fox"},
                    {"role": "assistant", "content": f"{tag} answer {i}: over the lazy dog"},
                ]
            }
        )
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """Three chat files beside where the mixture files go: 5, 4 and 6 records."""
    _chats(tmp_path / "synthesized.jsonl", "synth", 5)
    _chats(tmp_path / "code.jsonl", "code", 4)
    _chats(tmp_path / "own.jsonl", "own", 6)
    return tmp_path


def _prepare(tokenizer_dir: Path, mixture: Path, output: Path) -> int:
    return data_main(
        [
            "prepare",
            *("--tokenizer", str(tokenizer_dir), "--mixture", str(mixture)),
            *("--output", str(output), "--workers", "1"),
        ]
    )


def _mixed(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "mixture.jsonl").read_text().splitlines()]


def test_counts_per_source_are_exact_and_every_row_keeps_its_source(
    tokenizer_dir: Path, sources: Path, capsys: pytest.CaptureFixture
) -> None:
    mixture = sources / "mixture.toml"
    mixture.write_text(
        'seed = 3\n[[sources]]\npath = "synthesized.jsonl"\nrows = 3\n'
        '[[sources]]\nname = "python"\npath = "code.jsonl"\nrows = 7\n'
    )
    output = sources / "data"
    assert _prepare(tokenizer_dir, mixture, output) == 0
    printed = capsys.readouterr().out
    assert "source synthesized: 3 records drawn of 5" in printed and ", 3 rows" in printed
    assert "source python: 7 records drawn of 4 (repeated)" in printed
    assert source_counts(output) == {"python": 7, "synthesized": 3}
    mixed = _mixed(output)
    code = [r["messages"][0]["content"] for r in mixed if r["source"] == "python"]
    assert {text.split(":")[0] for text in code} == {f"code question {i}" for i in range(4)}
    assert all(
        r["messages"][0]["content"].startswith("synth")
        for r in mixed
        if r["source"] == "synthesized"
    )
    table = pa.ipc.open_file(pa.memory_map(str(output / "data-00000.arrow"))).read_all()
    assert table.column("source").to_pylist() == [r["source"] for r in mixed]
    assert data_main(["inspect", str(output), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == {"python": 7, "synthesized": 3}
    assert data_main(["inspect", str(output)]) == 0
    assert "rows per source:" in capsys.readouterr().out


def test_weights_share_the_total_exactly_and_the_mixture_is_deterministic(
    tokenizer_dir: Path, sources: Path
) -> None:
    mixture = sources / "weighted.toml"
    body = (
        '[[sources]]\npath = "synthesized.jsonl"\nweight = 0.5\n'
        '[[sources]]\npath = "code.jsonl"\nweight = 0.3\n'
        '[[sources]]\npath = "own.jsonl"\nweight = 0.2\n'
    )
    mixture.write_text("rows = 10\n" + body)
    assert _prepare(tokenizer_dir, mixture, sources / "a") == 0
    assert _prepare(tokenizer_dir, mixture, sources / "b") == 0
    assert source_counts(sources / "a") == {"synthesized": 5, "code": 3, "own": 2}
    assert _mixed(sources / "a") == _mixed(sources / "b")
    mixture.write_text("seed = 1\nrows = 10\n" + body)
    assert _prepare(tokenizer_dir, mixture, sources / "c") == 0
    assert source_counts(sources / "c") == source_counts(sources / "a")
    assert _mixed(sources / "c") != _mixed(sources / "a")


def test_without_a_total_weights_take_what_no_source_must_repeat() -> None:
    def mixture(*weights: float, rows: int | None = None) -> Mixture:
        return Mixture([Source(str(i), Path(), weight=w) for i, w in enumerate(weights)], rows)

    assert plan_counts(mixture(1, 1), [6, 3]) == [3, 3]
    assert plan_counts(mixture(2, 1), [100, 10]) == [20, 10]
    assert plan_counts(mixture(1, 1, 1, rows=10), [9, 9, 9]) == [4, 3, 3]
    fixed = Mixture([Source("a", Path(), rows=4), Source("b", Path(), weight=1.0)], rows=10)
    assert plan_counts(fixed, [2, 50]) == [4, 6]


def test_the_rows_that_rounding_leaves_go_to_the_largest_remainders() -> None:
    def weighted(*weights: float, rows: int) -> Mixture:
        return Mixture([Source(str(i), Path(), weight=w) for i, w in enumerate(weights)], rows)

    # 10 * 1/3 = 3.33 and 10 * 2/3 = 6.67: the one row left goes to the second source.
    assert plan_counts(weighted(1, 2, rows=10), [50, 50]) == [3, 7]
    # 1.2, 2.4, 2.4: the one row left goes to the first of the two largest remainders.
    assert plan_counts(weighted(1, 2, 2, rows=6), [50, 50, 50]) == [1, 3, 2]


def test_the_records_drawn_are_a_seeded_sample_and_repeats_cover_every_record(
    sources: Path,
) -> None:
    """3 of the 5 records of one source, and 7 of the 4 of another: written directly (no
    tokenizer), the records of each source are told by their question number."""

    def drawn(seed: int) -> dict[str, list[int]]:
        mixture = Mixture(
            [
                Source("synthesized", sources / "synthesized.jsonl", rows=3),
                Source("code", sources / "code.jsonl", rows=7),
            ],
            seed=seed,
        )
        output = sources / f"mixed{seed}.jsonl"
        write_mixture(mixture, output)
        records: dict[str, list[int]] = {"synthesized": [], "code": []}
        for line in output.read_text().splitlines():
            record = json.loads(line)
            question = record["messages"][0]["content"].split(":")[0]
            records[record["source"]].append(int(question.rsplit(" ", 1)[1]))
        return records

    samples = set()
    for seed in range(8):
        records = drawn(seed)
        assert records == drawn(seed)  # the same seed draws the same records, in order
        synthesized = sorted(records["synthesized"])
        assert len(set(synthesized)) == 3 and set(synthesized) <= set(range(5))
        samples.add(tuple(synthesized))
        # Every record of the smaller source once, then three distinct ones once more.
        code = sorted(records["code"])
        assert sorted(set(code)) == [0, 1, 2, 3]
        assert sorted(code.count(i) for i in set(code)) == [1, 2, 2, 2]
    assert len(samples) > 1, f"every seed drew the same records: {samples}"


def test_sources_of_one_size_draw_different_records(tmp_path: Path) -> None:
    """Each source draws with a seed of its own: two of the same size, each asked for a
    part of its records, do not draw the same line numbers."""
    mixture = Mixture(
        [
            Source("a", _chats(tmp_path / "a.jsonl", "a", 20), rows=5),
            Source("b", _chats(tmp_path / "b.jsonl", "b", 20), rows=5),
        ],
        seed=0,
    )
    write_mixture(mixture, tmp_path / "mixed.jsonl")
    drawn: dict[str, set[int]] = {"a": set(), "b": set()}
    for line in (tmp_path / "mixed.jsonl").read_text().splitlines():
        record = json.loads(line)
        question = record["messages"][0]["content"].split(":")[0]
        drawn[record["source"]].add(int(question.rsplit(" ", 1)[1]))
    assert len(drawn["a"]) == len(drawn["b"]) == 5
    assert drawn["a"] != drawn["b"], drawn


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[sources]]\npath = "code.jsonl"\n', "give either weight = W or rows = N"),
        ('[[sources]]\npath = "code.jsonl"\nrows = 2\ncolour = 1\n', "unknown key(s) colour"),
        ('[[sources]]\npath = "missing.jsonl"\nrows = 2\n', "missing.jsonl: no such file"),
        (
            'rows = 2\n[[sources]]\npath = "code.jsonl"\nrows = 5\n',
            "ask for 5 rows in all, not the mixture's rows = 2",
        ),
        ("seed = 1\n", "no sources"),
        (
            'rows = 10\n[[sources]]\npath = "code.jsonl"\nrows = 7\n',
            "ask for 7 rows in all, not the mixture's rows = 10",
        ),
        (
            '[[sources]]\npath = "code.jsonl"\nrows = 1\n'
            '[[sources]]\nname = "code"\npath = "own.jsonl"\nrows = 1\n',
            "two sources have the same name",
        ),
    ],
)
def test_a_bad_mixture_is_refused_by_name(
    tokenizer_dir: Path, sources: Path, capsys: pytest.CaptureFixture, body: str, message: str
) -> None:
    mixture = sources / "bad.toml"
    mixture.write_text(body)
    assert _prepare(tokenizer_dir, mixture, sources / "data") == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (sources / "data" / "mixture.jsonl").exists()
