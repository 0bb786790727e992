"""ringtrain-data regenerate --local: a tiny chat model written with save_pretrained answers
chat JSONL in this process, as transformers' own greedy generate answers the rendered
prompts, or draws its answers at a temperature; resume, the output lock and bad inputs
as on the server path."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ringtrain.cli.data import main as data_main
from ringtrain.data.regen_client import Completion, Sampling
from ringtrain.data.regen_local import LocalChat, LocalEngine
from ringtrain.data.regen_lock import OutputLock
from ringtrain.generate.batch_decode import STOP_CHECK_EVERY
from ringtrain.generate.continuous import Request, SlotDecoder
from ringtrain.generate.local_model import LocalModel
from ringtrain.target.tiny import CHAT_TEMPLATE, EOS_TOKEN_ID, build_tiny_target
from tests.helpers.sharp_attention import sharpen_attention

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_TOKENS = 10
# The template reads a keyword argument, so the rendered prompts show whether
# --chat-template-kwargs reached it.
TEMPLATE = "{%- if preamble is defined %}{{- preamble + '\\n' }}{%- endif %}" + CHAT_TEMPLATE
TEMPLATE_KWARGS = {"preamble": "answer briefly"}
CHATS = [
    {"id": "single", "messages": [{"role": "user", "content": "hello there"}]},
    {
        "id": "multi",
        "conversations": [
            {"from": "system", "value": "you are terse"},
            {"from": "human", "value": "first question"},
            {"from": "gpt", "value": "an old answer"},
            {"from": "human", "value": "second question"},
            {"from": "gpt", "value": "another old answer"},
        ],
    },
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": "one more prompt, a longer one"}]},
]
ROLES = {"human": "user", "gpt": "assistant"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense chat model whose greedy answers depend on the whole prompt (sharpened
    attention) and sometimes stop (the end-of-turn token's head row outscores the token
    that "question 4" answers fourth) and sometimes run to MAX_TOKENS."""
    directory = build_tiny_target(
        tmp_path_factory.mktemp("chat-model"), hybrid=False, num_layers=2, seed=1
    )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    sharpen_attention(model)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "question 4" * 4}],
        add_generation_prompt=True,
        return_dict=False,
    )
    probe = model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head[EOS_TOKEN_ID] = 1.01 * head[probe[0, -1]]
    model.save_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def test_the_models_answers_depend_on_the_whole_prompt(model_dir: Path) -> None:
    """The comparisons of decoding paths below mean something only if an answer depends on
    more than the prompt's last tokens: prompts that differ in their first character only
    get different answers."""
    local = LocalModel.load(model_dir, "cpu", "float32", batch_size=1)
    prompts = [
        local.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{first}ello there"}],
            add_generation_prompt=True,
            return_dict=False,
        )
        for first in "abcdefgh"
    ]
    answers = {tuple(local.answer([p], MAX_TOKENS)[0][0].tokens) for p in prompts}
    assert len(answers) >= 6


def _write_chats(path: Path) -> Path:
    path.write_text("".join(json.dumps(chat) + "\n" for chat in CHATS))
    return path


def _args(model: Path, chats: Path, output: Path, *extra: str) -> list[str]:
    return [
        "regenerate",
        *("--local", str(model), "--device", "cpu", "--threads", "1", "--input", str(chats)),
        *("--output", str(output), "--max-tokens", str(MAX_TOKENS)),
        *("--chat-template-kwargs", json.dumps(TEMPLATE_KWARGS), *extra),
    ]


def _expected(model_dir: Path) -> list[dict]:
    """Each chat answered turn by turn with transformers' greedy generate, worked out here."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = []
    for chat in CHATS:
        turns = chat.get("messages", chat.get("conversations"))
        messages = [
            {
                "role": ROLES.get(m.get("from"), m.get("from", m.get("role"))),
                "content": m.get("value", m.get("content")),
            }
            for m in turns
        ]
        if messages[-1]["role"] == "user":
            messages.append({"role": "assistant", "content": ""})
        done, stats = [], []
        for message in messages:
            if message["role"] == "assistant":
                prompt = tokenizer.apply_chat_template(
                    done, add_generation_prompt=True, return_dict=False, **TEMPLATE_KWARGS
                )
                out = model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=MAX_TOKENS,
                    do_sample=False,
                    eos_token_id=EOS_TOKEN_ID,
                )
                answer = out[0, len(prompt) :].tolist()
                text = tokenizer.decode(answer, skip_special_tokens=True)
                message = {"role": "assistant", "content": text}
                stopped = answer[-1] == EOS_TOKEN_ID
                stats.append(
                    {
                        "finish_reason": "stop" if stopped else "length",
                        "prompt_tokens": len(prompt),
                        "completion_tokens": len(answer),
                    }
                )
            done.append(message)
        expected.append({"messages": done, "turns": stats})
    return expected


def _records(output: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in output.read_text().splitlines()]
    return {r["regeneration"]["input_line"]: r for r in records}


def test_answers_are_transformers_greedy_generate_token_for_token(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "out.jsonl"
    assert data_main(_args(model_dir, chats, output, "--batch-size", "3")) == 0
    records = _records(output)
    expected = _expected(model_dir)
    assert sorted(records) == [1, 2, 3, 4]
    for line, want in enumerate(expected, start=1):
        record = records[line]
        assert record["messages"] == want["messages"], f"line {line}"
        assert record["regeneration"]["turns"] == want["turns"], f"line {line}"
        assert record["regeneration"]["model"] == str(model_dir.resolve())
    assert records[1]["id"] == "single" and records[2]["id"] == "multi"
    reasons = [t["finish_reason"] for w in expected for t in w["turns"]]
    assert set(reasons) == {"stop", "length"}, "the fixture should give both kinds of answer"
    captured = capsys.readouterr()
    assert "4/4" in captured.err  # the progress bar
    assert f"{reasons.count('length')} answers cut at --max-tokens" in captured.out
    assert "4 records regenerated" in captured.out and f"{len(reasons)} requests" in captured.out


def test_resume_skips_the_records_done(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, whole = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "whole.jsonl"
    assert data_main(_args(model_dir, chats, whole, "--no-progress")) == 0
    partial = tmp_path / "partial.jsonl"
    lines = whole.read_text().splitlines(keepends=True)
    done = [json.loads(line)["regeneration"]["input_line"] for line in lines[:2]]
    partial.write_text("".join(lines[:2]))
    shutil.copy(tmp_path / "whole.jsonl.settings.json", tmp_path / "partial.jsonl.settings.json")
    capsys.readouterr()
    assert data_main(_args(model_dir, chats, partial, "--no-progress", "--resume")) == 0
    assert _records(partial) == _records(whole)
    left = [_records(whole)[line] for line in {1, 2, 3, 4} - set(done)]
    turns = sum(len(r["regeneration"]["turns"]) for r in left)
    out = capsys.readouterr().out
    assert "2 records regenerated" in out and "(2 done before" in out
    assert f", {turns} requests" in out


def test_a_second_client_on_the_output_is_refused(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "out.jsonl"
    with OutputLock(output):
        assert data_main(_args(model_dir, chats, output, "--no-progress")) == 2
    assert "another regenerate client is writing it" in capsys.readouterr().err
    assert not output.exists()


def _without_template(model_dir: Path, directory: Path) -> Path:
    """The model of `model_dir` with a tokenizer that has no chat template."""
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, directory / name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no_template", "the model directory has no chat template"),
        ("top_p", "--temperature 0.7 / --top-p 0.0: the temperature must be at least 0"),
        ("missing_dir", "no such directory"),
        ("model_name", "with --local, leave it out"),
    ],
)
def test_bad_inputs_are_named_and_exit_2(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, case: str, message: str
) -> None:
    chats, output = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "out.jsonl"
    model, extra = model_dir, []
    if case == "no_template":
        model = _without_template(model_dir, tmp_path / "no-template")
    elif case == "top_p":
        extra = ["--temperature", "0.7", "--top-p", "0"]
    elif case == "missing_dir":
        model = tmp_path / "nowhere"
    else:
        extra = ["--model", "tiny"]
    assert data_main(_args(model, chats, output, "--no-progress", *extra)) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


def test_answers_drawn_at_a_temperature_and_a_nucleus_of_one_token_is_greedy(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """At temperature 1 the answers are drawn (they differ from the greedy ones); with a
    nucleus so small that only the most likely token stays, the draws are the greedy
    answers token for token. A rerun with another seed is refused (its settings differ)."""
    chats = _write_chats(tmp_path / "chats.jsonl")
    outputs = {name: tmp_path / f"{name}.jsonl" for name in ("greedy", "nucleus", "sampled")}
    assert data_main(_args(model_dir, chats, outputs["greedy"], "--no-progress")) == 0
    sample = ("--no-progress", "--temperature", "1", "--seed", "3")
    assert data_main(_args(model_dir, chats, outputs["nucleus"], *sample, "--top-p", "1e-9")) == 0
    assert data_main(_args(model_dir, chats, outputs["sampled"], *sample)) == 0
    greedy, nucleus, sampled = (_records(path) for path in outputs.values())
    assert sorted(sampled) == sorted(greedy) == [1, 2, 3, 4]
    assert all(nucleus[i]["messages"] == greedy[i]["messages"] for i in greedy)
    assert sum(sampled[i]["messages"] != greedy[i]["messages"] for i in greedy) >= 3
    capsys.readouterr()
    reseeded = (*sample[:-1], "4")
    assert data_main(_args(model_dir, chats, outputs["sampled"], *reseeded)) == 2
    assert "made with other settings (seed: 3 -> 4)" in capsys.readouterr().err


def test_local_and_server_exclude_each_other(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "out.jsonl"
    args = _args(model_dir, chats, output, "--server", "http://127.0.0.1:1/v1")
    with pytest.raises(SystemExit) as exit_:
        data_main(args)
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_conversations_in_flight_share_the_steps(model_dir: Path) -> None:
    sampling = Sampling(str(model_dir), MAX_TOKENS, chat_template_kwargs=TEMPLATE_KWARGS)
    questions = [[{"role": "user", "content": f"question {i}" * i}] for i in range(1, 7)]

    def answers(batch_size: int) -> list[Completion]:
        chat = LocalChat(
            LocalEngine(model_dir, device="cpu", batch_size=batch_size, threads=1), sampling
        )

        async def ask_all() -> list[Completion]:
            await chat.open()
            try:
                return await asyncio.gather(*(chat.complete(q) for q in questions))
            finally:
                await chat.aclose()

        completions = asyncio.run(ask_all())
        assert chat.requests == 6
        return completions

    assert answers(4) == answers(1)


def test_a_slot_takes_the_next_prompt_as_soon_as_its_answer_ends(model_dir: Path) -> None:
    local = LocalModel.load(model_dir, "cpu", batch_size=1)
    prompts = [[3 + i] * (4 + 5 * i) for i in range(5)]
    limits = [2, 9, 4, 9, 3]  # answers of different lengths free their slots at different steps
    alone = [local.answer([p], MAX_TOKENS)[0][0].tokens for p in prompts]
    decoder = SlotDecoder(local.model, 2, MAX_TOKENS, local.stop_ids, local.pad_id, 1 << 30)
    waiting = [Request(i, p, n) for i, (p, n) in enumerate(zip(prompts, limits, strict=True))]
    answers, steps = {}, 0
    with decoder.decoding():
        while waiting or decoder.active:
            taken, waiting = waiting[: decoder.free], waiting[decoder.free :]
            settled = decoder.admit(taken) + decoder.step()
            answers.update((request.key, answer) for request, answer in settled)
            steps += 1
            assert len(decoder.active) <= 2
    for i, limit in enumerate(limits):
        expected = alone[i][:limit]
        assert answers[i].tokens == expected
        assert answers[i].truncated == (EOS_TOKEN_ID not in expected)
    # Two slots share the steps: fewer than answers decoded one after another take (the
    # first token of each comes from its prompt's forward).
    assert steps < sum(len(a.tokens) - 1 for a in answers.values())


def test_a_slot_taken_over_from_a_longer_answer_sees_its_own_positions_only(
    model_dir: Path,
) -> None:
    """A short prompt entering the slot of a long one that ended, beside a long answer
    still in progress: it is answered as alone (nothing of the slot's last answer seen)."""
    local = LocalModel.load(model_dir, "cpu", batch_size=1)
    long_a, long_b = [[3 + (7 * i * j) % 200 for j in range(40 + 9 * i)] for i in (1, 2)]
    short = [[3 + (11 * i * j) % 200 for j in range(5 + i)] for i in (1, 2)]
    decoder = SlotDecoder(local.model, 2, MAX_TOKENS, local.stop_ids, local.pad_id, 1 << 30)
    requests = [Request("a", long_a, MAX_TOKENS), Request("b", long_b, 2)]
    requests += [Request(f"s{i}", prompt, MAX_TOKENS) for i, prompt in enumerate(short)]
    answers = {}
    with decoder.decoding():
        assert decoder.admit(requests[:2]) == []
        waiting = requests[2:]
        while waiting or decoder.active:
            taken, waiting = waiting[: decoder.free], waiting[decoder.free :]
            settled = decoder.admit(taken) + decoder.step()
            answers.update((request.key, answer) for request, answer in settled)
    for request in requests:
        alone = local.answer([request.prompt], request.max_new_tokens)[0][0]
        assert answers[request.key] == alone, request.key


def test_a_batch_answers_each_prompt_as_transformers_greedy_generate_alone(
    model_dir: Path,
) -> None:
    """LocalModel.answer decodes prompts of different lengths in one left-padded batch with
    its own key/value cache: each answer is transformers' greedy generate of its prompt
    alone, in the prompts' order, the stop token kept and an answer cut at the limit marked
    truncated; the tokens heard while decoding add up to the answers'. One answer stops
    early, the others run on past the batch's first check for stopped rows."""
    local = LocalModel.load(model_dir, "cpu", "float32", batch_size=8)
    questions = [3, 1, 4, 5, 2]  # not in length order; question 4's answer stops at 4 tokens
    prompts = [
        local.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"question {i}" * i}],
            add_generation_prompt=True,
            return_dict=False,
        )
        for i in questions
    ]
    new_tokens = STOP_CHECK_EVERY + 4
    heard: list[int] = []
    answers, stats = local.answer(prompts, new_tokens, on_tokens=heard.append)
    for prompt, answer in zip(prompts, answers, strict=True):
        out = local.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=local.stop_ids,
            pad_token_id=local.pad_id,
        )
        assert answer.tokens == out[0, len(prompt) :].tolist()
    assert [(len(a.tokens), a.truncated) for a in answers] == [
        (new_tokens, True),
        (new_tokens, True),
        (4, False),
        (new_tokens, True),
        (new_tokens, True),
    ]
    assert answers[2].tokens[-1] == EOS_TOKEN_ID
    assert stats.batches == 1
    assert sum(heard) == stats.new_tokens == sum(len(a.tokens) for a in answers)


@pytest.mark.gpu
def test_on_a_gpu_batches_answer_alike_and_report_tokens_as_they_decode(model_dir: Path) -> None:
    """On CUDA the turns are answered a batch at a time (CUDA graphs) as the CPU's
    continuous batching answers them, and tokens are reported during the batch."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sampling = Sampling(str(model_dir), 40, chat_template_kwargs=TEMPLATE_KWARGS)
    questions = [[{"role": "user", "content": f"question {i}" * i}] for i in range(1, 7)]

    def answers(device: str, heard: list[int]) -> list[Completion]:
        engine = LocalEngine(model_dir, device, "float32", batch_size=8, threads=1)
        chat = LocalChat(engine, sampling, heard.append)

        async def ask_all() -> list[Completion]:
            await chat.open()
            try:
                return await asyncio.gather(*(chat.complete(q) for q in questions))
            finally:
                await chat.aclose()

        return asyncio.run(ask_all())

    on_gpu: list[int] = []
    completions = answers("cuda", on_gpu)
    assert completions == answers("cpu", [])
    assert sum(on_gpu) == sum(c.completion_tokens for c in completions)
    longest = max(c.completion_tokens for c in completions)
    assert len(on_gpu) >= 1 + longest // 16  # a report at every stop check, not per batch
