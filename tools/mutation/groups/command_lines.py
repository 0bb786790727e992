"""The mutants of the command lines: the argparse types they share (ringtrain/cli/arg_types.py),
ringtrain-eval's checks of its values before any model loads, in one line with exit status
2, and the error that names real divergences from greedy decoding (ringtrain/cli/eval.py),
and ringtrain-data's options for regenerate's engine and its exit statuses
(ringtrain/cli/data.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

ARG_TYPE_TESTS = ("tests/test_eval_failures.py", "tests/test_data_cli.py")
DATA_CLI_TESTS = ("tests/test_data_cli.py", "tests/test_prepare.py")
EVAL_CLI_TESTS = (
    "tests/test_eval_failures.py",
    "tests/test_eval_ties.py",
    "tests/test_eval_cli.py",
)

GROUPS = (
    Group("evaluation command line", "ringtrain/cli/eval.py", EVAL_CLI_TESTS, (
        Mutant("a refusal's usage printed whole",
               "        self.exit(2, f\"{self.prog}: {message} (see {self.prog} --help)\\n\")",
               "        super().error(message)"),
        Mutant("no prompts accepted", "    if not args.prompts and not args.benchmark:\n",
               "    if False:\n"),
        Mutant("a temperature given twice accepted", "    if repeated:\n", "    if False:\n"),
        Mutant("greedy decoding drawn at temperature 0",
               "SamplingSettings(t, args.top_p, args.seed) if t > 0 else None",
               "SamplingSettings(t, args.top_p, args.seed) if t >= 0 else None"),
        Mutant("the sampling seed ignored", "SamplingSettings(t, args.top_p, args.seed)",
               "SamplingSettings(t, args.top_p, 0)"),
        Mutant("--top-p without sampling accepted",
               "if args.top_p != 1.0 and all(t == 0 for t in temperatures):", "if False:"),
        Mutant("only the first five divergences' count", "f\"{len(report.mismatches)} of",
               "f\"{len(report.mismatches[:5])} of"),
        Mutant("an unmeasured margin printed as a number",
               "margin = \"unmeasured\" if m[\"margin\"] is None else f\"{m['margin']:.4g}\"",
               "margin = f\"{m['margin']}\""),
        Mutant("a lossy run exits 0",
               "    return 1 if any(report.lossless is False for report in reports) else 0",
               "    return 0"),
        Mutant("one temperature's JSON wrapped as several",
               "results[0] if len(results) == 1 else {\"evaluations\": results}",
               "{\"evaluations\": results}"),
    )),
    Group("argument types", "ringtrain/cli/arg_types.py", ARG_TYPE_TESTS, (
        Mutant("a JSON list taken for template options", "    if not isinstance(value, dict):\n",
               "    if False:\n"),
        Mutant("the least whole number refused", "        if value < minimum:",
               "        if value <= minimum:"),
        Mutant("a whole number below the least accepted", "        if value < minimum:",
               "        if value < minimum - 1:"),
        Mutant("an infinite number accepted", "if not (math.isfinite(value) and value >= 0):",
               "if not (value >= 0):"),
        Mutant("zero refused", "if not (math.isfinite(value) and value >= 0):",
               "if not (math.isfinite(value) and value > 0):"),
    )),
    Group("data command line", "ringtrain/cli/data.py", DATA_CLI_TESTS, (
        Mutant("--model taken with --local", "        if args.model is not None:\n", "        if False:\n"),
        Mutant("a server without a model name", "    if args.model is None:\n", "    if False:\n"),
        Mutant("a local option taken with --server", "    if given:\n", "    if False:\n"),
        Mutant("a batch size of 0 taken", '"--batch-size",\n        type=whole(1),',
               '"--batch-size",\n        type=whole(0),'),
        Mutant("a bad memory limit taken as none", "            limit = parse_size(args.memory_limit)",
               "            limit = None"),
        Mutant("the local seed lost", "        args.seed or 0,", "        0,"),
        Mutant("a server's answers without a length",
               "max_tokens = args.max_tokens or (None if local else SERVER_MAX_TOKENS)",
               "max_tokens = args.max_tokens"),
        Mutant("a local run named as given", "model = str(args.local.expanduser().resolve()) if local else args.model",
               "model = str(args.local) if local else args.model"),
        Mutant("a server gone exits 2", "        return 3\n", "        return 2\n"),
        Mutant("failed records exit 0", "    return 1 if totals.failed else 0", "    return 0"),
        Mutant("a stop after the run not said", "    if totals.stopped_by:\n", "    if False:\n"),
        Mutant("inspect --row without a tokenizer", "    if args.tokenizer is None:\n", "    if False:\n"),
    )),
)  # fmt: skip
