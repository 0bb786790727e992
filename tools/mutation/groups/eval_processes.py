"""The mutants of ringtrain-eval's worker processes: tasks handed out as workers pull them, reports passed on, a dead worker named (ringtrain/eval/processes.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

TESTS = ("tests/test_eval_processes.py", "tests/test_eval_workers.py")

GROUPS = (
    Group("eval workers", "ringtrain/eval/processes.py", TESTS, (
        Mutant("a worker's first pull (no report yet) passed on as a report",
               "                    if value is not None:\n", "                    if True:\n"),
        Mutant("a worker's report dropped",
               "                        on_report(value)\n", "                        pass\n"),
        Mutant("every worker told it is worker 0",
               "args=(function, args, (k, workers), theirs)",
               "args=(function, args, (0, workers), theirs)"),
        Mutant("the results in the order the workers finished, not of k",
               "return [results[k] for k in range(len(pipes))]", "return list(results.values())"),
        Mutant("a worker that sent its result and ended taken for dead",
               "pending = [pipe for k, pipe in enumerate(pipes) if k not in results]",
               "pending = list(pipes)"),
        Mutant("a worker's exception not raised (its closed pipe then read as a death)",
               '            if kind == "error":\n', '            if kind == "failed":\n'),
        Mutant("a worker's exception raised without its traceback",
               "raise value from WorkerTraceback(text)", "raise value"),
        Mutant("an exception that pickles but does not unpickle sent as it is",
               "        pickle.loads(pickle.dumps(error))\n", "        pickle.dumps(error)\n"),
        Mutant("a dead worker's closed pipe (EOFError) not taken for its death",
               "            except PEER_GONE:\n                raise _died(k, processes)",
               "            except (BrokenPipeError, ConnectionResetError):\n"
               "                raise _died(k, processes)"),
        Mutant("the dead worker named from 1, not 0",
               'f"worker {k} of {len(processes)}', 'f"worker {k + 1} of {len(processes)}'),
        Mutant("a worker killed by a signal leaves with its negative exit code",
               "shell_code(code) or 1,", "code or 1,"),
        Mutant("the parent keeps the worker's end of its pipe (a death never seen)",
               "            theirs.close()  # the worker", "            pass  # the worker"),
        Mutant("the workers still running at the end not terminated",
               "                process.terminate()\n", "                pass\n"),
        Mutant("the workers not waited for at the end (left as zombies)",
               "        for process in processes:\n            process.join()\n", ""),
    )),
)  # fmt: skip
