"""The mutants of the prompts a recipe builds: `ringtrain-data synthesize`'s run (the settings
it refuses before loading a model, the settings kept beside its output, and its rounds'
bookkeeping: how many it writes, where a rerun continues, when it gives up, what it says;
ringtrain/data/synthesize.py) and the code prompts made from installed Python sources (which
functions, which kinds, the benchmark kept out, duplicates, the file written whole;
ringtrain/data/code_prompts.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

CODE_PROMPT_TESTS = ("tests/test_code_prompts.py",)
SYNTHESIZE_TESTS = (
    "tests/test_synthesize_settings.py", "tests/test_synthesize.py",
    "tests/test_synthesize_progress.py",
)  # fmt: skip

GROUPS = (
    Group("synthesis run", "ringtrain/data/synthesize.py", SYNTHESIZE_TESTS, (
        Mutant("--num 0 accepted", "(options.num >= 1,", "(options.num >= 0,"),
        Mutant("a third turn accepted", "options.turns in (1, 2)", "options.turns in (1, 2, 3)"),
        Mutant("temperature 0 accepted", "(options.temperature > 0,", "(options.temperature >= 0,"),
        Mutant("top-p 0 accepted", "(0 < options.top_p <= 1,", "(0 <= options.top_p <= 1,"),
        Mutant("no new tokens accepted", "(options.max_tokens >= 1,", "(options.max_tokens >= 0,"),
        Mutant("an answer of no tokens accepted", "options.answer_tokens >= 1,",
               "options.answer_tokens >= 0,"),
        Mutant("fewest words above the most accepted",
               "0 <= options.min_words <= options.max_words,", "0 <= options.min_words,"),
        Mutant("a negative batch size accepted", "options.batch_size >= 0,", "True,"),
        Mutant("a topic hint without its place accepted",
               "\"{topic}\" in options.topic_hint,", "True,"),
        Mutant("an empty topic accepted",
               "for text in options.systems + options.topics):", "for text in options.systems):"),
        Mutant("a directory without config.json loaded",
               "if not (options.target / \"config.json\").is_file():", "if False:"),
        Mutant("the answer's tokens decide one-turn records",
               "\"answer_tokens\": self.answer_tokens if self.turns == 2 else None,",
               "\"answer_tokens\": self.answer_tokens,"),
        Mutant("the topic hint decides unsteered records",
               "\"topic_hint\": self.topic_hint if self.topics else None,",
               "\"topic_hint\": self.topic_hint,"),
        Mutant("the seed not among the kept settings", "            \"seed\": self.seed,\n", ""),
        Mutant("the steerings' prefixes not rendered before the output is touched",
               "user_turn_prefix(tokenizer, steer.writing_history(options.topic_hint), kwargs)",
               "pass"),
        Mutant("the turns written before not in the index",
               "index.keep([record.first_user_turn for record in output.records])", "pass"),
        Mutant("a round's surplus written", "for record in result.records[:wanted]:",
               "for record in result.records:"),
        Mutant("a finished output loads the model", "if totals.done_before < options.num:",
               "if True:"),
        Mutant("a rerun's rounds from the first", "number = output.next_round", "number = 0"),
        Mutant("a stall never ends the run", "if barren >= STALL_ROUNDS:", "if False:"),
        Mutant("a stall of one round fewer ends the run", "if barren >= STALL_ROUNDS:",
               "if barren >= STALL_ROUNDS - 1:"),
        Mutant("a kept round does not end a stall",
               "barren = 0 if result.records else barren + 1", "barren += 1"),
        Mutant("a stop not taken between rounds", "        raise_taken_stop()\n", ""),
        Mutant("the torn line's drop not said", "if output.cut_bytes:", "if False:"),
        Mutant("a taken-over lock not said", "if lock.taken_over:", "if False:"),
        Mutant("the dropped turns not in the summary", "if totals.rejected:", "if False:"),
    )),
    Group("code prompts", "ringtrain/data/code_prompts.py", CODE_PROMPT_TESTS, (
        Mutant("the shortest functions kept", "if not doc or not MIN_LINES <= span <= MAX_LINES",
               "if not doc or not 1 <= span <= MAX_LINES"),
        Mutant("the longest functions kept", "if not doc or not MIN_LINES <= span <= MAX_LINES",
               "if not doc or not MIN_LINES <= span"),
        Mutant("a function without a docstring kept", "if not doc or not MIN_LINES",
               "if False or not MIN_LINES"),
        Mutant("a dunder method kept", "or node.name.startswith(\"__\"):", "or False:"),
        Mutant("a huge file read", "if path.stat().st_size > MAX_FILE_BYTES:", "if False:"),
        Mutant("the benchmark's package read", "skipped = {*EXCLUDED_PACKAGES, \"site-packages\", \"dist-packages\"}",
               "skipped = {\"site-packages\", \"dist-packages\"}"),
        Mutant("a benchmark problem's name kept", "        if function.name in excluded_names:\n            continue\n", ""),
        Mutant("every kind drawn alike", "for _ in range(KIND_WEIGHTS.get(kind, 1))]", "for _ in range(1)]"),
        Mutant("the kind not from the seed",
               "digest = hashlib.sha256(f\"{seed}:{function.origin}:{function.name}\".encode()).digest()",
               "digest = hashlib.sha256(f\"{function.origin}:{function.name}\".encode()).digest()"),
        Mutant("the stub ends before its docstring", "doc_end = node.body[0].end_lineno", "doc_end = node.body[0].lineno"),
        Mutant("the docstring left in the bare source",
               "kept = lines[node.lineno - 1 : doc.lineno - 1] + lines[doc.end_lineno : node.end_lineno]",
               "kept = lines[node.lineno - 1 : node.end_lineno]"),
        Mutant("identical prompts kept twice", "        if key not in seen:\n", "        if True:\n"),
        Mutant("the prompts in reading order", "    random.Random(seed).shuffle(records)\n", ""),
        Mutant("a count of 0 keeps none", "return records[:count] if count else records",
               "return records[:count]"),
        Mutant("a partial output left behind", "        partial.unlink(missing_ok=True)", "        pass"),
    )),
)  # fmt: skip
