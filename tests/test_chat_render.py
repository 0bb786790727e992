"""Chat prompts rendered as a server renders them: the exact prompt text, one BOS where the
template writes one, template errors named by prompt, answers without special tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from ringtrain.generate.chat import ChatRenderer, check_messages
from ringtrain.generate.prompts import PromptFileError
from tests.helpers.chat_data import QWEN_STYLE_TEMPLATE

# Gemma's way with a system message: the template refuses it.
NO_SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- raise_exception('System role not supported') }}{%- endif %}" + QWEN_STYLE_TEMPLATE
)


def _saved(tokenizer, directory: Path):
    """`tokenizer` written to `directory` and read back, as a target directory holds it."""
    tokenizer.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def bos_tokenizer(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The Qwen-style tokenizer made Llama-like: encoding adds a BOS, and so does the template."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    bos = "<|endoftext|>"
    bos_id = tokenizer.convert_tokens_to_ids(bos)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tokenizer.bos_token = bos
    tokenizer.chat_template = "{{- bos_token }}" + QWEN_STYLE_TEMPLATE
    return _saved(tokenizer, tmp_path_factory.mktemp("bos_tokenizer"))


def test_a_prompt_is_the_conversation_and_the_assistant_generation_prompt(
    tokenizer_dir: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = ChatRenderer(tokenizer).render([{"role": "user", "content": "hello"}], "a test")
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_templates_bos_is_the_only_one(bos_tokenizer) -> None:
    bos = bos_tokenizer.bos_token_id
    assert bos_tokenizer.encode("hello")[0] == bos, "encoding adds a BOS of its own"
    renderer = ChatRenderer(bos_tokenizer, system="be brief.")
    ids = renderer.render([{"role": "user", "content": "hello"}], "a test")
    assert ids[0] == bos and ids.count(bos) == 1
    assert bos_tokenizer.decode(ids[1:]) == (
        "<|im_start|>system\nbe brief.<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_error_names_the_prompt(tokenizer_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = NO_SYSTEM_TEMPLATE
    tokenizer = _saved(tokenizer, tmp_path)
    user = [{"role": "user", "content": "hello"}]
    assert ChatRenderer(tokenizer).render(user, "p.jsonl:3")  # no system message: rendered
    with pytest.raises(PromptFileError) as raised:
        ChatRenderer(tokenizer, system="be brief.").render(user, "p.jsonl:3")
    assert str(raised.value) == (
        "p.jsonl:3: the chat template refused the messages: System role not supported"
    )


def test_an_answers_text_leaves_its_special_tokens_out(tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokens = tokenizer.encode("paris is the capital<|im_end|>", add_special_tokens=False)
    assert tokens[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ChatRenderer(tokenizer).answer_text(tokens) == "paris is the capital"


def test_the_given_assistant_answers_are_left_out_of_a_conversation() -> None:
    messages = [
        {"role": "system", "content": "be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "name": "bot"},
        {"role": "user", "content": "and now?", "name": "me"},
    ]
    assert check_messages(messages, "a test") == [
        {"role": "system", "content": "be brief."},
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "and now?"},
    ]
