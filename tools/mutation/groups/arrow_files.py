"""The mutants of the dataset's Arrow files: how they are listed, named, read and checked (ringtrain/data/arrow_files.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

TESTS = ("tests/test_data_reader.py", "tests/test_arrow_files.py")

GROUPS = (
    Group("arrow files", "ringtrain/data/arrow_files.py", TESTS, (
        Mutant("a stream-format file (as Hugging Face datasets writes) unreadable",
               "        source.seek(0)\n        return pa.ipc.open_stream(source)",
               "        raise"),
        Mutant("a directory's files read in directory order, not by name",
               "files = sorted(p for p in path.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())",
               "files = [p for p in path.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file()]"),
        Mutant("a folder named like a data file listed as one",
               " and p.is_file())", ")"),
        Mutant("a torn .arrow.partial left by a stopped prepare read as data",
               "if p.suffix in DATA_SUFFIXES and",
               "if any(s in p.name for s in DATA_SUFFIXES) and"),
        Mutant("a directory without data files accepted", "    if not files:\n",
               "    if files is None:\n"),
        Mutant("a single parquet file given as data.path refused", "    if path.is_file():\n",
               '    if path.is_file() and path.suffix == ".arrow":\n'),
        Mutant("a file that is not Arrow raised as pyarrow's error, its name unsaid",
               "    except (OSError, pa.ArrowException) as exc:\n", "    except OSError as exc:\n"),
        Mutant("a large_list column refused",
               "if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):",
               "if not pa.types.is_list(typ):"),
        Mutant("boolean input_ids accepted as tokens",
               "name == LOSS_MASK and pa.types.is_boolean(value_type)",
               "pa.types.is_boolean(value_type)"),
        Mutant("a wrong type's message names the other column's expected type",
               "'int32' if name == INPUT_IDS else 'uint8'",
               "'int32' if name == LOSS_MASK else 'uint8'"),
        Mutant("a null row named by its place in its record batch, not in its file",
               "row = first_row + int(", "row = int("),
        Mutant("null values inside a row's list read as tokens", "    if values.null_count:\n",
               "    if chunk.null_count:\n"),
        Mutant("a wide token id 0 refused as out of range", "flat.min() < 0", "flat.min() <= 0"),
        Mutant("rows numbered one short after each record batch",
               "first_row += len(ids_chunk)", "first_row += len(ids_chunk) - 1"),
        Mutant("a length mismatch named by its place in its record batch",
               'f"{path}: row {first_row + bad}: "', 'f"{path}: row {bad}: "'),
    )),
)  # fmt: skip
