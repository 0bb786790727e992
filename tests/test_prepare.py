"""ringtrain-data prepare/inspect round trip with a tokenizer built here (Qwen-style template)."""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data import BatchStream, open_dataset
from ringtrain.data.chat import ConversationEncoder, conversation_messages
from ringtrain.data.errors import DatasetError
from ringtrain.data.prepare import CHUNKS_IN_FLIGHT_PER_WORKER, load_tokenizer, prepare_dataset
from ringtrain.data.row_view import format_row, read_row
from ringtrain.data.stats import dataset_statistics
from tests.helpers.chat_data import (
    ASSISTANT_TEXTS,
    CONVERSATIONS,
)


def _expected_mask(tokenizer, ids: np.ndarray, generated: list[str]) -> np.ndarray:
    """Mark, by decoding, the tokens of each generated text after an assistant header."""
    pieces = [tokenizer.decode([int(i)]) for i in ids]
    text = "".join(pieces)
    ends = np.cumsum([len(p) for p in pieces])
    starts = ends - [len(p) for p in pieces]
    mask = np.zeros(len(ids), dtype=np.uint8)
    cursor = 0
    for answer in generated:
        begin = text.index("<|im_start|>assistant\n" + answer, cursor)
        begin += len("<|im_start|>assistant\n")
        end = begin + len(answer)
        mask[(starts < end) & (ends > begin)] = 1
        cursor = end
    return mask


def test_prepare_inspect_train_round_trip(
    tokenizer_dir: Path, chats: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "data"
    args = [
        "prepare",
        "--tokenizer",
        str(tokenizer_dir),
        "--input",
        str(chats),
        "--output",
        str(out),
    ]
    assert data_main([*args, "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "2 samples" in printed and "dropped 1" in printed

    assert data_main(["inspect", str(out), "--vocab-size", "300", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["rows"] == 2 and 0 < stats["supervised_fraction"] < 1

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    ds = open_dataset(out, max_len=512, truncate=False, block_size=2, vocab_size=len(tokenizer))
    assert ds.num_rows == 2
    stream = BatchStream(ds, token_budget=512, bucket=32, seed=0, rank=0, world=1)
    found = 0
    for batch in islice(stream, stream.batches_per_epoch):
        for d in range(batch.num_docs):
            doc = slice(batch.cu_seqlens[d], batch.cu_seqlens[d + 1])
            ids, mask = batch.input_ids[doc], batch.loss_mask[doc]
            text = tokenizer.decode(ids)
            index = 0 if "paris" in text else 1
            rendered = tokenizer.apply_chat_template(
                conversation_messages(CONVERSATIONS[index], "test"), tokenize=False
            )
            assert text == rendered  # the template's rendering, no extra special tokens
            generated = [answer + "<|im_end|>" for answer in ASSISTANT_TEXTS[index]]
            expected = _expected_mask(tokenizer, ids, generated)
            np.testing.assert_array_equal(mask, expected)
            masked_text = tokenizer.decode(ids[mask.astype(bool)])
            assert masked_text == "<|im_end|>".join(ASSISTANT_TEXTS[index]) + "<|im_end|>"
            found += 1 << index
    assert found == 3


def test_parallel_prepare_matches_serial(tokenizer_dir: Path, chats: Path, tmp_path: Path) -> None:
    serial = prepare_dataset(tokenizer_dir, chats, tmp_path / "a", workers=1, progress=None)
    parallel = prepare_dataset(tokenizer_dir, chats, tmp_path / "b", workers=2, progress=None)
    assert serial == parallel
    a = (tmp_path / "a" / "data-00000.arrow").read_bytes()
    assert a == (tmp_path / "b" / "data-00000.arrow").read_bytes()


def test_parallel_prepare_writes_every_chunk_once_in_input_order(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of one line each: more chunks than the workers hold in flight, each row
    written once, in the input's order, the last chunks in flight included."""
    monkeypatch.setattr("ringtrain.data.prepare.LINES_PER_TASK", 1)
    question = CONVERSATIONS[0]["messages"][0]
    lines = 2 * CHUNKS_IN_FLIGHT_PER_WORKER * 2 + 3
    path = tmp_path / "chats.jsonl"
    path.write_text(
        "".join(
            json.dumps({"messages": [question, {"role": "assistant", "content": "paris " * n}]})
            + "\n"
            for n in range(1, lines + 1)
        )
    )
    parallel = prepare_dataset(tokenizer_dir, path, tmp_path / "b", workers=2, progress=None)
    assert parallel.samples == lines
    serial = prepare_dataset(tokenizer_dir, path, tmp_path / "a", workers=1, progress=None)
    assert parallel == serial
    lengths = [len(read_row(tmp_path / "b", r)[0]) for r in range(lines)]
    assert lengths == sorted(set(lengths))  # each answer one word longer than the last
    a = (tmp_path / "a" / "data-00000.arrow").read_bytes()
    assert a == (tmp_path / "b" / "data-00000.arrow").read_bytes()


def test_prepare_runs_one_worker_per_core_it_may_use(
    tokenizer_dir: Path, chats: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Not one per core of the machine: a container or a `taskset` gives fewer."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        args = ["--tokenizer", str(tokenizer_dir), "--input", str(chats)]
        assert data_main(["prepare", *args, "--output", str(tmp_path / "data")]) == 0
    finally:
        os.sched_setaffinity(0, allowed)
    assert "with 1 process(es)" in capsys.readouterr().err


def test_max_len_truncates(tokenizer_dir: Path, chats: Path, tmp_path: Path) -> None:
    # The rows have 59 and 133 tokens; their first assistant tokens are at 45 and 51.
    totals = prepare_dataset(tokenizer_dir, chats, tmp_path / "t", max_len=56, progress=None)
    assert totals.truncated == 2 and totals.tokens == 112
    assert totals.supervised_tokens == (56 - 45) + (56 - 51)
    assert open_dataset(tmp_path / "t", max_len=56, truncate=False, block_size=1).max_row_len == 56


def test_a_row_of_exactly_max_len_is_not_truncated(
    tokenizer_dir: Path, chats: Path, tmp_path: Path
) -> None:
    totals = prepare_dataset(tokenizer_dir, chats, tmp_path / "t", max_len=59, progress=None)
    assert totals.truncated == 1 and totals.tokens == 59 + 59


def test_rows_flushed_in_many_record_batches_are_written_once_in_order(
    tokenizer_dir: Path, chats: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = prepare_dataset(tokenizer_dir, chats, tmp_path / "whole", progress=None)
    monkeypatch.setattr("ringtrain.data.prepare.LINES_PER_TASK", 1)
    monkeypatch.setattr("ringtrain.data.prepare.FLUSH_TOKENS", 1)
    split = prepare_dataset(tokenizer_dir, chats, tmp_path / "split", progress=None)
    assert split == whole
    rows = [read_row(tmp_path / "whole", r) for r in range(2)]
    ds = open_dataset(tmp_path / "split", max_len=512, truncate=False, block_size=1)
    assert len(ds.segments) == 2 and ds.num_rows == 2
    for r, (ids, mask) in enumerate(rows):
        np.testing.assert_array_equal(read_row(tmp_path / "split", r)[0], ids)
        np.testing.assert_array_equal(read_row(tmp_path / "split", r)[1], mask)


def test_errors_name_the_input_line_in_any_chunk(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ringtrain.data.prepare.LINES_PER_TASK", 2)
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join([json.dumps(CONVERSATIONS[0])] * 5 + ["{not json"]) + "\n")
    with pytest.raises(DatasetError, match=r"chats\.jsonl:6: not valid JSON"):
        prepare_dataset(tokenizer_dir, path, tmp_path / "out", progress=None)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"chats\.jsonl:2: not valid JSON"),
        ('{"text": "hi"}', r"chats\.jsonl:2: expected an object with a non-empty 'messages'"),
        (
            '{"messages": [{"role": "robot", "content": "x"}]}',
            r"chats\.jsonl:2: message 0 has role 'robot'",
        ),
        ('{"messages": [{"role": "user"}]}', r"chats\.jsonl:2: message 0 has no text 'content'"),
    ],
)
def test_bad_input_lines_are_named(
    tokenizer_dir: Path, tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(CONVERSATIONS[0]) + "\n" + line + "\n")
    with pytest.raises(DatasetError, match=message):
        prepare_dataset(tokenizer_dir, path, tmp_path / "out", progress=None)
    assert not any((tmp_path / "out").iterdir())  # no partial dataset left behind


def test_existing_output_is_refused(tokenizer_dir: Path, chats: Path, tmp_path: Path) -> None:
    prepare_dataset(tokenizer_dir, chats, tmp_path / "o", progress=None)
    with pytest.raises(DatasetError, match="already holds a dataset"):
        prepare_dataset(tokenizer_dir, chats, tmp_path / "o", progress=None)


def test_inspect_fails_on_bad_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "bad.arrow").write_bytes(b"garbage")
    assert data_main(["inspect", str(tmp_path)]) == 2
    assert "bad.arrow: cannot read" in capsys.readouterr().err


def tokenizer_with_template(tokenizer_dir: Path, template: str):
    """The test tokenizer with ``template`` as its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tokenizer.chat_template = template
    return tokenizer


def test_template_without_end_marker_is_rejected(tokenizer_dir: Path) -> None:
    tokenizer = tokenizer_with_template(
        tokenizer_dir, "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(DatasetError, match="no end-of-turn marker"):
        ConversationEncoder(tokenizer)


# Qwen3's shape: assistant turns after the last user message carry a (here empty)
# reasoning block that the model generates; earlier turns are rendered without it.
QWEN3_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_rendering_earlier_turns_otherwise_is_refused_by_turn(
    tokenizer_dir: Path,
) -> None:
    """The conversation before an assistant turn, rendered on its own with the generation
    prompt, must begin the whole rendering: that is how the turn is found. A template whose
    header counts the messages breaks it, and the error names the turn."""
    template = (
        "{{- '<|im_start|>system\\n' + (messages | length | string) + ' messages<|im_end|>\\n' }}"
        "{%- for m in messages %}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    encoder = ConversationEncoder(tokenizer_with_template(tokenizer_dir, template))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(DatasetError) as refused:
        encoder.encode(messages, "chats.jsonl:1")
    assert str(refused.value).startswith(
        "chats.jsonl:1: the chat template renders the conversation before assistant message 1 "
        "differently on its own"
    )


def test_qwen3_style_reasoning_block_is_supervised(tokenizer_dir: Path) -> None:
    tokenizer = tokenizer_with_template(tokenizer_dir, QWEN3_STYLE_TEMPLATE)
    encoder = ConversationEncoder(tokenizer)
    messages = conversation_messages(CONVERSATIONS[1], "test")
    ids, mask, truncated = encoder.encode(messages, "test")
    assert not truncated
    first, last = ASSISTANT_TEXTS[1]
    generated = [first + "<|im_end|>", "<think>\n\n</think>\n\n" + last + "<|im_end|>"]
    np.testing.assert_array_equal(mask, _expected_mask(tokenizer, ids, generated))
    assert tokenizer.decode(ids[mask.astype(bool)]) == "".join(generated)


@pytest.mark.parametrize(("block_size", "dropped"), [(None, 1), (4, 0), (28, 1), (40, 2)])
def test_prepare_reports_the_rows_training_drops(
    tokenizer_dir: Path,
    chats: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    block_size: int | None,
    dropped: int,
) -> None:
    """The two rows have 13 and 56 supervised tokens; the default block size is 16; a row
    with exactly 2 * block_size supervised tokens is kept."""
    args = ["prepare", "--tokenizer", str(tokenizer_dir), "--input", str(chats)]
    args += ["--output", str(tmp_path / "data"), "--workers", "1"]
    args += ["--block-size", str(block_size)] if block_size else []
    assert data_main(args) == 0
    size = block_size or 16
    assert (
        f"{dropped} of 2 rows have fewer than {2 * size} supervised tokens "
        f"(2 x block size {size}): training will drop them"
    ) in capsys.readouterr().out
    stats = dataset_statistics(tmp_path / "data", block_size=size)
    assert stats["rows_too_few_supervised"] == dropped  # what inspect and training count
    if dropped < 2:
        ds = open_dataset(tmp_path / "data", max_len=512, truncate=False, block_size=size)
        assert ds.num_dropped == dropped


def test_inspect_row_marks_the_supervised_tokens(
    tokenizer_dir: Path, chats: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "data"
    prepare_dataset(tokenizer_dir, chats, out, progress=None)
    inspect = ["inspect", str(out), "--tokenizer", str(tokenizer_dir)]
    assert data_main([*inspect, "--row", "0"]) == 0
    header, text = capsys.readouterr().out.split("\n", 1)
    assert header == (
        f"row 0 of {out}: 59 tokens, 13 supervised (marked ⟦ ⟧); training drops this row "
        "(fewer than 32 supervised tokens, 2 x block size 16)"
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nwhat is the capital of france?<|im_end|>\n"
        "<|im_start|>assistant\n⟦paris is the capital of france.<|im_end|>⟧\n\n"
    )
    assert data_main([*inspect, "--row", "1", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["supervised_tokens"] == 56
    assert [p["text"] for p in view["pieces"] if p["supervised"]] == [
        answer + "<|im_end|>" for answer in ASSISTANT_TEXTS[1]
    ]


@pytest.mark.parametrize(
    ("supervised", "dropped"), [(8, True), (31, True), (32, False), (90, False)]
)
def test_inspect_row_says_dropped_below_two_blocks_of_supervised_tokens(
    supervised: int, dropped: bool
) -> None:
    """Training drops a row of fewer than 2 x 16 supervised tokens at block size 16 (one of
    exactly 32 is kept, as prepare's count says): the header says so for those rows only."""
    view = {"row": 3, "path": "data", "tokens": 100, "supervised_tokens": supervised, "text": "x"}
    header, text = format_row(view, 16).split("\n")
    kept = f"row 3 of data: 100 tokens, {supervised} supervised (marked ⟦ ⟧)"
    note = "; training drops this row (fewer than 32 supervised tokens, 2 x block size 16)"
    assert (header, text) == (kept + note if dropped else kept, "x")


def test_inspect_row_refusals_name_the_fix(
    tokenizer_dir: Path, chats: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "data"
    prepare_dataset(tokenizer_dir, chats, out, progress=None)
    assert data_main(["inspect", str(out), "--row", "0"]) == 2
    assert "inspect --row needs --tokenizer DIR" in capsys.readouterr().err
    assert data_main(["inspect", str(out), "--row", "2", "--tokenizer", str(tokenizer_dir)]) == 2
    assert "there is no row 2; the dataset has 2 rows (0..1)" in capsys.readouterr().err


# A reasoning model's template: an assistant turn renders its reasoning_content first.
REASONING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is defined %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_reasoning_content_is_rendered_and_supervised(tokenizer_dir: Path) -> None:
    tokenizer = tokenizer_with_template(tokenizer_dir, REASONING_TEMPLATE)
    answer, thought = "paris is the capital of france.", "the quick brown fox"
    record = {
        "messages": [
            {"role": "user", "content": "what is the capital of france?"},
            {"role": "assistant", "content": answer, "reasoning_content": thought},
            {"role": "user", "content": "and trains?", "reasoning_content": 3},
        ]
    }
    messages = conversation_messages(record, "test")
    assert messages[1]["reasoning_content"] == thought
    assert "reasoning_content" not in messages[2]  # only text is kept
    ids, mask, _ = ConversationEncoder(tokenizer).encode(messages, "test")
    generated = f"<think>\n{thought}\n</think>\n\n{answer}<|im_end|>"
    assert tokenizer.decode(ids[mask.astype(bool)]) == generated


def test_a_model_directory_without_tokenizer_files_is_refused_by_name(tmp_path: Path) -> None:
    """transformers would build an empty tokenizer from config.json alone."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 40}))
    with pytest.raises(DatasetError, match=r"no tokenizer here \(none of tokenizer\.json, "):
        load_tokenizer(tmp_path)
