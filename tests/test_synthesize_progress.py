"""ringtrain-data synthesize shows generation while a round decodes: a round reports its
tokens every few decode steps (not once at its end), and a second progress bar counts
them with their rate. A tiny word-level chat model writes the turns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data.near_duplicates import NearDuplicateIndex
from ringtrain.data.synth_filters import FilterSettings
from ringtrain.data.synth_rounds import Synthesizer
from ringtrain.data.synth_steering import steerings
from ringtrain.data.synthesize import SynthesisOptions
from ringtrain.generate.local_model import LocalModel
from tests.helpers.word_chat_model import build_word_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS, MAX_TOKENS = 16, 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_chat_model(tmp_path_factory.mktemp("word-chat"))


def test_a_round_reports_its_tokens_while_it_decodes(model_dir: Path, tmp_path: Path) -> None:
    options = SynthesisOptions(model_dir, tmp_path / "unused.jsonl", ROWS, max_tokens=MAX_TOKENS)
    model = LocalModel.load(model_dir, "cpu", batch_size=ROWS)
    synthesizer = Synthesizer(
        model,
        options.round_settings(),
        steerings([], []),
        FilterSettings(),
        NearDuplicateIndex(0.7),
    )
    reports: list[int] = []
    result = synthesizer.run(0, ROWS, reports.append)

    # One batch of ROWS turns: every report but the last came before the batch finished.
    assert len(reports) >= 2 and all(count > 0 for count in reports)
    assert sum(reports) == result.tokens > ROWS


def test_the_token_bar_counts_every_generated_token(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "prompts.jsonl"
    argv = ["synthesize", "--target", str(model_dir), "--output", str(output), "--num", "6"]
    assert data_main([*argv, "--device", "cpu", "--batch-size", "8", "--max-tokens", "24"]) == 0
    captured = capsys.readouterr()
    tokens = int(re.search(r"(\d+) tokens \(", captured.out).group(1))
    shown = [int(count) for count in re.findall(r"generate: (\d+)tok \[", captured.err)]
    assert shown[-1] == tokens and shown == sorted(shown)
    assert re.search(r"generate: \d+tok \[[\d:]+, [\d.]+tok/s\]", captured.err)
