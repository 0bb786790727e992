"""Prompt files: one JSON object per line, read with their line numbers, and the checks
every prompt passes (token ids of the target's vocabulary, text prompts, raw encoding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ringtrain.generate.prompts import (
    PromptFileError,
    check_prompt_ids,
    encode_raw,
    prompt_text,
    read_prompt_records,
)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ---- reading a file -----------------------------------------------------------------------


def test_records_come_with_their_line_numbers_past_blank_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p.jsonl",
        ['{"prompt": "a"}', "", "   ", '{"input_ids": [1, 2]}', '{"turns": ["x"]}'],
    )
    assert read_prompt_records(path) == [
        (1, {"prompt": "a"}),
        (4, {"input_ids": [1, 2]}),
        (5, {"turns": ["x"]}),
    ]


def test_a_line_separator_inside_a_prompt_does_not_cut_the_line(tmp_path: Path) -> None:
    text = "one\u2028two\u2029three\x85four"
    path = _write(tmp_path / "p.jsonl", [json.dumps({"prompt": text}, ensure_ascii=False)])
    assert read_prompt_records(path) == [(1, {"prompt": text})]


def test_bad_json_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", ['{"prompt": "a"}', "", '{"prompt": '])
    with pytest.raises(PromptFileError, match=r"p\.jsonl:3: not valid JSON"):
        read_prompt_records(path)


@pytest.mark.parametrize("line", ['"a prompt"', '["prompt"]', '{"text": "a"}'])
def test_a_line_without_a_prompt_field_is_refused(tmp_path: Path, line: str) -> None:
    path = _write(tmp_path / "p.jsonl", ['{"prompt": "a"}', line])
    with pytest.raises(PromptFileError, match=r"p\.jsonl:2: each line must be an object"):
        read_prompt_records(path)


def test_only_the_fields_asked_for_are_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", ['{"messages": []}', '{"prompt": "a"}'])
    with pytest.raises(PromptFileError, match=r'p\.jsonl:2: .* one of "messages"$'):
        read_prompt_records(path, fields=("messages",))
    assert len(read_prompt_records(path)) == 2


@pytest.mark.parametrize("lines", [[], ["", "  "]])
def test_a_file_without_prompts_is_refused(tmp_path: Path, lines: list[str]) -> None:
    with pytest.raises(PromptFileError, match="no prompts; write one JSON object per line"):
        read_prompt_records(_write(tmp_path / "p.jsonl", lines))


def test_a_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match=r"nothing\.jsonl: cannot read prompts file"):
        read_prompt_records(tmp_path / "nothing.jsonl")


def test_a_file_that_is_not_utf8_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    with pytest.raises(PromptFileError, match=r"latin\.jsonl: not UTF-8 text .*save the file"):
        read_prompt_records(path)


# ---- checking a prompt ------------------------------------------------------------------


def test_ids_of_the_vocabulary_are_kept() -> None:
    assert check_prompt_ids([0, 5, 99], 100, "p:1") == [0, 5, 99]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1.0, 2.0], "p:1: input_ids must be a list of ints"),
        ("1 2", "p:1: input_ids must be a list of ints"),
        ([], "p:1: the prompt is empty"),
        ([3, 100], r"p:1: token ids outside the target's vocabulary \(0\.\.99\)"),
        ([-1, 3], r"p:1: token ids outside the target's vocabulary \(0\.\.99\)"),
    ],
)
def test_bad_ids_are_refused(ids: object, message: str) -> None:
    with pytest.raises(PromptFileError, match=message):
        check_prompt_ids(ids, 100, "p:1")


def test_a_prompt_must_be_text() -> None:
    assert prompt_text("import os", "p:1") == "import os"
    with pytest.raises(PromptFileError, match='p:1: "prompt" must be text'):
        prompt_text(["a", "b"], "p:1")


def _tokenizer_with_bos() -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose encoding adds <s> before the text by default."""
    vocab = {"<unk>": 0, "<s>": 1, "hello": 2, "world": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")


def test_raw_text_is_encoded_without_special_tokens() -> None:
    tokenizer = _tokenizer_with_bos()
    assert tokenizer.encode("hello world") == [1, 2, 3]
    assert encode_raw(tokenizer, "hello world", "p:1") == [2, 3]


def test_raw_text_without_a_tokenizer_is_refused() -> None:
    with pytest.raises(PromptFileError, match=r"p:1: the prompt is text but .* no tokenizer"):
        encode_raw(None, "hello", "p:1")
