"""A content fingerprint of a local model directory: which model made a file of answers.

A path names a directory, not what it holds: weights replaced in place keep the path,
and a directory moved elsewhere changes it. The fingerprint hashes what decides a
model's answers, cheaply: the config, generation config, tokenizer and chat template
files whole, and for each weight file its name, its size, its first and last MiB and
``SAMPLES`` evenly spaced pieces between (a few MiB read however large the model). Files
are taken from the directory's top level by name (``SMALL_SUFFIXES``,
``WEIGHT_SUFFIXES``); others (a README, hidden files) do not count, and neither do
timestamps, so a copied or moved directory keeps its fingerprint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SMALL_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
EDGE = 1 << 20
SAMPLES = 16
SAMPLE = 1 << 16
SHOWN = 16  # hex digits of the digest in the fingerprint


def _weight_digest(path: Path) -> bytes:
    """The digest of a weight file's name, size, edges and samples."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as file:
        if size <= 2 * EDGE + SAMPLES * SAMPLE:
            digest.update(file.read())
            return digest.digest()
        offsets = [0, *(EDGE + (size - 2 * EDGE) * i // SAMPLES for i in range(SAMPLES))]
        for offset in offsets:
            file.seek(offset)
            digest.update(file.read(EDGE if offset == 0 else SAMPLE))
        file.seek(size - EDGE)
        digest.update(file.read(EDGE))
    return digest.digest()


def model_fingerprint(directory: Path) -> str:
    """``sha256:`` and the first hex digits of the digest of the model's files."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.name.endswith(WEIGHT_SUFFIXES):
            digest.update(_weight_digest(path))
        elif path.name.endswith(SMALL_SUFFIXES):
            digest.update(f"{path.name}\0".encode() + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:SHOWN]
