"""The mutants of chat prompts rendered with the target's chat template as a server renders them (ringtrain/generate/chat.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

CHAT_TESTS = (
    "tests/test_chat_render.py", "tests/test_eval_chat.py", "tests/test_generate_rounds.py",
)  # fmt: skip

GROUPS = (
    Group("chat rendering", "ringtrain/generate/chat.py", CHAT_TESTS, (
        Mutant("the assistant generation prompt not added",
               "add_generation_prompt=True,", "add_generation_prompt=False,"),
        Mutant("the template options (enable_thinking and the like) dropped",
               "                **self.template_kwargs,\n", ""),
        Mutant("the default system message added before a conversation's own",
               'if self.system is not None and messages[0]["role"] != "system":',
               "if self.system is not None:"),
        Mutant("the default system message lost",
               'messages = [{"role": "system", "content": self.system}, *messages]',
               "messages = list(messages)"),
        Mutant("the default system message put after the conversation",
               'messages = [{"role": "system", "content": self.system}, *messages]',
               'messages = [*messages, {"role": "system", "content": self.system}]'),
        Mutant("the rendered prompt kept as text, not token ids",
               "tokenize=True,", "tokenize=False,"),
        Mutant("the template's encoding returned as a dict, not token ids",
               "                return_dict=False,\n", ""),
        Mutant("special tokens added again to the rendered prompt",
               "        return list(ids)\n",
               "        return self.tokenizer.encode(self.tokenizer.decode(ids))\n"),
        Mutant("a template error not turned into a PromptFileError",
               "        except TemplateError as exc:\n", "        except ValueError as exc:\n"),
        Mutant("a template error not naming the prompt",
               'f"{where}: the chat template refused the messages: {exc}"',
               'f"the chat template refused the messages: {exc}"'),
        Mutant("a tokenizer without a chat template taken for one with",
               'return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))',
               "return self.tokenizer is not None"),
        Mutant("the special tokens of an answer kept in its text",
               "skip_special_tokens=True", "skip_special_tokens=False"),
        Mutant("the given assistant messages kept in the prompt",
               'if message["role"] != "assistant":', "if True:"),
        Mutant("a conversation without a user message accepted",
               'if not any(m["role"] == "user" for m in kept):', "if not kept:"),
    )),
)  # fmt: skip
