"""A data mixture: several chat JSONL sources mixed by weight or count into one file.

A mixture file (TOML) names its sources; ``ringtrain-data prepare --mixture`` writes
the mixed conversations and prepares them, each row keeping its source::

    seed = 0            # optional: fixes which records are drawn and their order
    rows = 60000        # optional: the total that the weighted sources share

    [[sources]]
    name = "synthesized"             # optional: the file's stem
    path = "synthesized.regen.jsonl" # relative to the mixture file
    weight = 0.5

    [[sources]]
    path = "code.regen.jsonl"
    rows = 20000                     # an exact count instead of a weight

A source with ``rows`` gives exactly that many records; weighted sources share the rest
of the mixture's ``rows`` in proportion to their weights (largest remainders, so the
counts add up exactly), or, without it, as many as they can without any of them
repeating a record; without weighted sources the mixture's ``rows``, if given, must be
the sum of theirs. A source asked for more records than it holds repeats them: every record the
same number of times, then a seeded sample of them once more. Records are drawn by a
seeded permutation per source, and the mixed file is shuffled with the seed, so the
same mixture file and inputs always give the same dataset.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ringtrain.data.arrow_files import DATA_SUFFIXES
from ringtrain.data.errors import DatasetError
from ringtrain.data.prepare import PrepareTotals, prepare_dataset
from ringtrain.data.sources import SOURCE, source_counts

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

MIXED_FILE = "mixture.jsonl"  # the mixed records, kept in the dataset directory
SOURCE_KEYS = {"name", "path", "weight", "rows"}
TOP_KEYS = {"seed", "rows", "sources"}


@dataclass(frozen=True)
class Source:
    """One source of a mixture: a chat JSONL file and its weight or exact count."""

    name: str
    path: Path
    weight: float | None = None
    rows: int | None = None


@dataclass(frozen=True)
class Mixture:
    """The sources, the total rows the weighted ones share (None: as many as they can)
    and the seed."""

    sources: list[Source]
    rows: int | None = None
    seed: int = 0


def _unknown(keys: set[str], allowed: set[str], where: str) -> None:
    extra = sorted(keys - allowed)
    if extra:
        raise DatasetError(
            f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )


def _source(table: Any, number: int, base: Path, where: str) -> Source:
    """One [[sources]] table, checked."""
    here = f"{where}: source {number}"
    if not isinstance(table, dict) or not isinstance(table.get("path"), str):
        raise DatasetError(f'{here}: needs path = "FILE.jsonl" (a chat JSONL file)')
    _unknown(set(table), SOURCE_KEYS, here)
    weight, rows = table.get("weight"), table.get("rows")
    if (weight is None) == (rows is None):
        raise DatasetError(f"{here}: give either weight = W or rows = N (exactly one of them)")
    if weight is not None and not (isinstance(weight, int | float) and weight > 0):
        raise DatasetError(f"{here}: weight must be a number above 0, not {weight!r}")
    if rows is not None and not (isinstance(rows, int) and rows >= 0):
        raise DatasetError(f"{here}: rows must be a whole number >= 0, not {rows!r}")
    path = (base / table["path"]).expanduser()
    if not path.is_file():
        raise DatasetError(f"{here}: {path}: no such file")
    name = table.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise DatasetError(f"{here}: name must be non-empty text, not {name!r}")
    return Source(name, path, None if weight is None else float(weight), rows)


def read_mixture(path: str | Path) -> Mixture:
    """The mixture described by a TOML file; raises DatasetError naming what is wrong."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the mixture file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DatasetError(f"{path}: not valid TOML ({exc})") from None
    _unknown(set(table), TOP_KEYS, str(path))
    listed = table.get("sources")
    if not isinstance(listed, list) or not listed:
        raise DatasetError(f'{path}: no sources; add [[sources]] tables with path = "..."')
    sources = [_source(t, n, path.parent, str(path)) for n, t in enumerate(listed, start=1)]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise DatasetError(f"{path}: two sources have the same name; give each a name = ...")
    rows, seed = table.get("rows"), table.get("seed", 0)
    if rows is not None and not (isinstance(rows, int) and rows >= 0):
        raise DatasetError(f"{path}: rows must be a whole number >= 0, not {rows!r}")
    if not isinstance(seed, int):
        raise DatasetError(f"{path}: seed must be a whole number, not {seed!r}")
    return Mixture(sources, rows, seed)


def record_lines(path: Path) -> list[bytes]:
    """The non-blank lines of a JSONL file."""
    with path.open("rb") as lines:
        return [line for line in lines if line.strip()]


def _shares(weights: list[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` by largest remainders (sums exactly)."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def plan_counts(mixture: Mixture, available: list[int]) -> list[int]:
    """The records to draw from each source (see the module docstring)."""
    fixed = sum(s.rows for s in mixture.sources if s.rows is not None)
    weighted = [i for i, s in enumerate(mixture.sources) if s.weight is not None]
    counts = [s.rows or 0 for s in mixture.sources]
    if mixture.rows is not None and (
        fixed > mixture.rows or (not weighted and fixed != mixture.rows)
    ):
        raise DatasetError(
            f"the sources with rows = N ask for {fixed} rows in all, not the mixture's "
            f"rows = {mixture.rows}: make them agree (or leave out the mixture's rows)"
        )
    if not weighted:
        return counts
    weights = [mixture.sources[i].weight for i in weighted]
    if mixture.rows is None:
        share = min(available[i] * sum(weights) / w for i, w in zip(weighted, weights, strict=True))
        total = int(share + 1e-9)
        while any(c > available[i] for i, c in zip(weighted, _shares(weights, total), strict=True)):
            total -= 1
    else:
        total = mixture.rows - fixed
    for i, count in zip(weighted, _shares(weights, total), strict=True):
        counts[i] = count
    return counts


def _draw(lines: int, count: int, rng: random.Random) -> list[int]:
    """``count`` line indices of ``lines``: whole passes over them, then a sample."""
    if count and not lines:
        raise DatasetError("a source with no records cannot give any; remove it")
    passes, rest = divmod(count, lines) if lines else (0, 0)
    return list(range(lines)) * passes + sorted(rng.sample(range(lines), rest))


@dataclass(frozen=True)
class MixedSource:
    """What the mixture took from one source."""

    source: Source
    available: int
    drawn: int


def write_mixture(mixture: Mixture, output: Path) -> list[MixedSource]:
    """Write the mixed records (each with its ``source`` name) to ``output``, shuffled with
    the seed; returns what was drawn from each source."""
    contents = [record_lines(s.path) for s in mixture.sources]
    counts = plan_counts(mixture, [len(lines) for lines in contents])
    picks: list[tuple[int, int]] = []
    for index, (source, lines, count) in enumerate(
        zip(mixture.sources, contents, counts, strict=True)
    ):
        rng = random.Random(f"{mixture.seed}/{source.name}")
        try:
            picks += [(index, line) for line in _draw(len(lines), count, rng)]
        except DatasetError as exc:
            raise DatasetError(f"source {source.name} ({source.path}): {exc}") from None
    random.Random(mixture.seed).shuffle(picks)
    encoder = msgspec.json.Encoder()
    with output.open("wb") as file:
        for index, line in picks:
            record = _decoded(contents[index][line], mixture.sources[index], line)
            record[SOURCE] = mixture.sources[index].name
            file.write(encoder.encode(record) + b"\n")
    return [
        MixedSource(s, len(lines), count)
        for s, lines, count in zip(mixture.sources, contents, counts, strict=True)
    ]


def _decoded(line: bytes, source: Source, index: int) -> dict[str, Any]:
    try:
        record = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        record = exc
    if not isinstance(record, dict):
        raise DatasetError(
            f"{source.path}: record {index + 1} (non-blank line) is not a JSON object; "
            "fix or remove it"
        )
    return record


@dataclass(frozen=True)
class MixtureReport:
    """What preparing a mixture did: per source, what was drawn and the rows written."""

    drawn: list[MixedSource]
    rows: dict[str, int]
    totals: PrepareTotals


def prepare_mixture(
    mixture_file: str | Path, tokenizer_dir: str | Path, output_dir: str | Path, **options: Any
) -> MixtureReport:
    """Mix the sources of ``mixture_file`` into ``<output_dir>/mixture.jsonl`` and prepare
    it into ``output_dir`` with a source column; ``options`` go to ``prepare_dataset``."""
    mixture = read_mixture(mixture_file)
    output = Path(output_dir)
    mixed = output / MIXED_FILE
    if mixed.exists() or (
        output.is_dir() and any(p.suffix in DATA_SUFFIXES for p in output.iterdir())
    ):
        raise DatasetError(
            f"{output}: already holds a dataset or a mixture; choose an empty or new output "
            "directory"
        )
    output.mkdir(parents=True, exist_ok=True)
    names = [s.name for s in mixture.sources]
    try:
        drawn = write_mixture(mixture, mixed)
        totals = prepare_dataset(tokenizer_dir, mixed, output, sources=names, **options)
    except BaseException:
        mixed.unlink(missing_ok=True)  # made here: a rerun starts afresh
        raise
    return MixtureReport(drawn, source_counts(output) or {}, totals)
