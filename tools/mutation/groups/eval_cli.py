"""The mutants of ringtrain-eval's command line: the values it refuses before any model
loads, in one line with exit status 2, and the error that names real divergences from greedy
decoding (ringtrain/cli/eval.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

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
        Mutant("a JSON list taken for template options", "    if not isinstance(value, dict):\n",
               "    if False:\n"),
        Mutant("the least whole number refused", "        if value < minimum:",
               "        if value <= minimum:"),
        Mutant("a whole number below the least accepted", "        if value < minimum:",
               "        if value < minimum - 1:"),
        Mutant("an infinite number accepted", "if not (math.isfinite(value) and value >= 0):",
               "if not (value >= 0):"),
        Mutant("zero refused as a temperature", "if not (math.isfinite(value) and value >= 0):",
               "if not (math.isfinite(value) and value > 0):"),
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
)  # fmt: skip
