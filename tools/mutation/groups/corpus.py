"""The mutants of the toy recipe's corpus, the Python standard library's own files (ringtrain/data/corpus.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

CORPUS_TESTS = ("tests/test_corpus.py",)

GROUPS = (
    Group("toy corpus", "ringtrain/data/corpus.py", CORPUS_TESTS, (
        Mutant("the sources read in the order the file system lists them",
               "    sources = sorted(\n", "    sources = list(\n"),
        Mutant("the test directories of the library read",
               'SKIPPED_PARTS = {"test", "tests",', 'SKIPPED_PARTS = {"tests",'),
        Mutant("site-packages read as the library's own sources",
               '"idle_test", "site-packages", "__pycache__"', '"idle_test", "__pycache__"'),
        Mutant("the licence left out",
               'first = [root / "LICENSE.txt", root / "pydoc_data" / "topics.py"]',
               'first = [root / "pydoc_data" / "topics.py"]'),
        Mutant("the documentation topics read twice, second and among the sources",
               "and path not in first\n", "\n"),
        Mutant("an undecodable file stopping the read",
               'text = path.read_text(encoding="utf-8", errors="replace")',
               'text = path.read_text(encoding="utf-8")'),
        Mutant("an empty file kept as a document",
               "        if not text.strip():\n            continue\n", ""),
        Mutant("the size cap ignored for the last file",
               "documents.append(text[: max_bytes - total])", "documents.append(text)"),
        Mutant("the read going on after the cap is reached exactly",
               "        if total >= max_bytes:\n", "        if total > max_bytes:\n"),
        Mutant("the prompts carved from an unseeded generator",
               "    rng = random.Random(seed)\n", "    rng = random.Random()\n"),
        Mutant("the train part running into the eval part's text",
               '"train": (0.0, 0.9)', '"train": (0.0, 1.0)'),
        Mutant("a prompt starting at the newline before a line",
               'start = text.find("\\n", rng.randrange(low, high - span), high - span) + 1',
               'start = text.find("\\n", rng.randrange(low, high - span), high - span)'),
    )),
)  # fmt: skip
