"""The mutants of what a stopped command and a running rank leave users to read: how the
data, evaluation and conversion commands take SIGTERM and Ctrl-C, hold them back while
worker processes start and turn them into an exit status and a last line
(ringtrain/interrupts.py), and each rank's log file, the terminal's progress stream and
metrics.jsonl as a session opens it (ringtrain/trainer/logs.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

COMMAND_STOP_TESTS = (
    "tests/test_interrupts.py", "tests/test_code_prompts.py", "tests/test_gguf_convert.py",
    "tests/test_synthesize.py", "tests/test_prepare_failures.py",
)  # fmt: skip
RANK_LOG_TESTS = (
    "tests/test_rank_logs.py", "tests/test_fresh_start.py", "tests/test_progress_lines.py",
)  # fmt: skip

GROUPS = (
    Group("command stops", "ringtrain/interrupts.py", COMMAND_STOP_TESTS, (
        Mutant("a Ctrl-C exits 1", "EXIT_STATUS = {CTRL_C: 128 + signal.SIGINT,",
               "EXIT_STATUS = {CTRL_C: 1,"),
        Mutant("a worker's result awaited with stops let through (a stop inside leaves its lock held)",
               "        with stops_deferred():\n            try:\n                return future.result(",
               "        if True:\n            try:\n                return future.result("),
        Mutant("a SIGTERM exits as a Ctrl-C (130)", "SIGTERM: 128 + signal.SIGTERM}",
               "SIGTERM: 128 + signal.SIGINT}"),
        Mutant("a SIGTERM taken as a Ctrl-C",
               "stop = Terminated if signum == signal.SIGTERM else KeyboardInterrupt",
               "stop = KeyboardInterrupt"),
        Mutant("a stop a finalizer swallowed forgotten", "    _TAKEN.append(stop)\n", ""),
        Mutant("the handlers before a command's not restored",
               "            signal.signal(signum, before)", "            pass"),
        Mutant("a Ctrl-C taken by a background job started with it ignored",
               "if signal.getsignal(signal.SIGINT) is signal.default_int_handler:", "if True:"),
        Mutant("a Ctrl-C a finalizer swallowed forgotten", "        signums.append(signal.SIGINT)",
               "        pass"),
        Mutant("a stop remembered after the command", "    finally:\n        _TAKEN.clear()",
               "    finally:\n        pass"),
        Mutant("a stopped data command exits 0",
               "        file=sys.stderr,\n    )\n    return EXIT_STATUS[name]",
               "        file=sys.stderr,\n    )\n    return 0"),
        Mutant("an all-or-nothing command stopped unfinished exits 0",
               'before it finished", file=sys.stderr)\n    return EXIT_STATUS[name]',
               'before it finished", file=sys.stderr)\n    return 0'),
        Mutant("a stop while workers start lost", "        if held:\n", "        if False:\n"),
        Mutant("the stops left blocked once the workers started",
               "        signal.pthread_sigmask(signal.SIG_SETMASK, mask)", "        pass"),
        Mutant("a worker ended by a Ctrl-C while it imports",
               "signal.signal(signal.SIGINT, signal.SIG_IGN)",
               "signal.signal(signal.SIGINT, signal.default_int_handler)"),
        Mutant("a worker ended by SIGTERM exits 1", "raise SystemExit(128 + signum)",
               "raise SystemExit(1)"),
    )),
    Group("rank logs", "ringtrain/trainer/logs.py", RANK_LOG_TESTS, (
        Mutant("the log file not named by its role", 'f"rank{rank}-{role}.log"',
               'f"rank{rank}.log"'),
        Mutant("the logs directory not created",
               "    path.parent.mkdir(parents=True, exist_ok=True)\n", ""),
        Mutant("a resumed session's log emptied", 'path.open("a", buffering=1',
               'path.open("w", buffering=1'),
        Mutant("info lines left out of the rank log", "logger.setLevel(logging.INFO)",
               "logger.setLevel(logging.WARNING)"),
        Mutant("the level left out of a log line", '{role} %(levelname)s %(message)s"',
               '{role} %(message)s"'),
        Mutant("a second setup's lines written to the first one's file too",
               "    logger.handlers.clear()\n", ""),
        Mutant("every rank's progress on the terminal",
               "terminal.setLevel(logging.INFO if terminal_progress else logging.WARNING)",
               "terminal.setLevel(logging.INFO)"),
        Mutant("the lead drafter's progress kept off the terminal",
               "terminal.setLevel(logging.INFO if terminal_progress else logging.WARNING)",
               "terminal.setLevel(logging.WARNING)"),
        Mutant("file-only records on the terminal", "    terminal.addFilter(_NotFileOnly())\n",
               ""),
        Mutant("terminal lines not naming their rank",
               'logging.Formatter(f"[rank{rank} {role}] %(message)s")',
               'logging.Formatter("%(message)s")'),
        Mutant("the kernel fallback notice on the console",
               "return self.notice not in record.getMessage()", "return True"),
        Mutant("a torn last line of metrics.jsonl kept when nothing is superseded",
               "if len(whole) < len(content) else []", "if False else []"),
        Mutant("the metrics before a resume not kept aside",
               '        shutil.copyfile(path, path.with_name(path.name + ".pre-resume"))\n', ""),
        Mutant("the held-out rounds due after a resume's checkpoint kept twice",
               'last_kept = {"step": resumed_step, "eval": evaluated_step}.get(record.get("event"))',
               'last_kept = {"step": resumed_step}.get(record.get("event"))'),
    )),
)  # fmt: skip
