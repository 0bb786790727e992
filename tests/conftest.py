"""Fixtures shared by several test modules (each module opts in by name)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.chat_data import write_chats, write_tokenizer


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One CPU thread for a whole module (so also for its module-scoped fixtures): tiny
    models run fastest so, also when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Qwen-style chat tokenizer on disk (tests.chat_data)."""
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests.chat_data's conversations as a chat JSONL file."""
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl")
