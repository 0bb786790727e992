"""The chat template's parts that synthesis uses: the text before a new user turn's content
(after the history, with the template's options), its token ids without added special
tokens, the template's markers (role headers between a user's and the assistant's
content, and the special tokens), and a template or tokenizer that cannot serve refused
with the reason."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ringtrain.data.errors import DatasetError
from ringtrain.data.synth_template import (
    encode_prefix,
    require_chat_template,
    template_markers,
    user_turn_prefix,
)

SPECIALS = ["<s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = [*SPECIALS, "system", "user", "assistant", "be", "brief", "kind"]
# ChatML, with a default system message and a reasoning line before an answer when asked.
CHATML = (
    "{%- if messages[0]['role'] != 'system' and default_system is defined %}"
    "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and reasoning is defined %}"
    "{{- '<reasoning/>\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
)
# Indented role headers, and a two-character rule between turns.
PLAIN = (
    "{%- for message in messages %}"
    "{{- '  >> ' + message['role'] + ' \\n' + message['content'] + '\\n--\\n' }}"
    "{%- endfor %}"
)
NO_SYSTEM = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{%- endif %}"
    "{{- message['role'] + ': ' + message['content'] + '\\n' }}"
    "{%- endfor %}"
)
TWICE = "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + m['content'] }}{%- endfor %}"
NEVER = "{%- for m in messages %}{{- m['role'] + ': ...\\n' }}{%- endfor %}"


def _tokenizer(template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose encodings begin with <s> (as Llama's do)."""
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", VOCAB.index("<s>"))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    tokenizer.chat_template = template
    return tokenizer


SPECIAL_MARKERS = ["<s>", "<unk>", "<|endoftext|>", "<|im_end|>"]


def test_the_prefix_is_the_history_then_the_user_header() -> None:
    tokenizer = _tokenizer()
    assert user_turn_prefix(tokenizer, []) == "<|im_start|>user\n"
    history = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "be kind"},
        {"role": "assistant", "content": "kind"},
    ]
    assert user_turn_prefix(tokenizer, history) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nbe kind<|im_end|>\n"
        "<|im_start|>assistant\nkind<|im_end|>\n<|im_start|>user\n"
    )


def test_the_templates_options_shape_the_prefix_and_the_markers() -> None:
    tokenizer = _tokenizer()
    options = {"default_system": "be kind", "reasoning": True}
    assert user_turn_prefix(tokenizer, [], options) == (
        "<|im_start|>system\nbe kind<|im_end|>\n<|im_start|>user\n"
    )
    assert "<reasoning/>" in template_markers(tokenizer, options)
    assert "<reasoning/>" not in template_markers(tokenizer)


def test_a_prefix_is_encoded_without_the_tokenizers_added_tokens() -> None:
    tokenizer = _tokenizer()
    assert tokenizer("user")["input_ids"][0] == VOCAB.index("<s>")  # what is left out
    ids = encode_prefix(tokenizer, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")
    names = ["<|im_start|>", "system", "be", "brief", "<|im_end|>", "<|im_start|>", "user"]
    assert ids == [VOCAB.index(name) for name in names]


def test_the_markers_are_the_lines_between_the_turns_and_the_special_tokens() -> None:
    expected = sorted(["<|im_start|>assistant", *SPECIAL_MARKERS])
    assert template_markers(_tokenizer()) == expected


def test_markers_are_stripped_and_pieces_under_three_characters_are_not_markers() -> None:
    # between the turns: "\n--\n  >> assistant \n"; "--" is too common to mean a leak
    assert template_markers(_tokenizer(PLAIN)) == sorted([">> assistant", *SPECIAL_MARKERS])


@pytest.mark.parametrize(("template", "times"), [(TWICE, 2), (NEVER, 0)])
def test_a_template_that_does_not_render_the_users_content_once_is_refused(
    template: str, times: int
) -> None:
    with pytest.raises(DatasetError, match=f"found {times} times"):
        user_turn_prefix(_tokenizer(template), [])


def test_a_template_refusing_a_role_is_named_with_its_reason() -> None:
    tokenizer = _tokenizer(NO_SYSTEM)
    assert user_turn_prefix(tokenizer, []) == "user: "
    history = [{"role": "system", "content": "be brief"}]
    with pytest.raises(
        DatasetError,
        match=r"refused a system/user conversation \(System role not supported\); "
        "if it rejects the system role, leave out --system and --topic",
    ):
        user_turn_prefix(tokenizer, history)


@pytest.mark.parametrize(
    ("tokenizer", "missing"),
    [(None, "no tokenizer"), (_tokenizer(None), "no chat template"), (_tokenizer(""), "no chat")],
)
def test_a_model_without_a_template_is_refused_naming_the_target(
    tokenizer: PreTrainedTokenizerFast | None, missing: str
) -> None:
    with pytest.raises(DatasetError, match=f"--target base-model: the model has {missing}"):
        require_chat_template(tokenizer, "base-model")
    require_chat_template(_tokenizer(), "chat-model")
