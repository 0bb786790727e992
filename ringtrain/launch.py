"""ringtrain-launch: torchrun for ringtrain.main, with one line at the end instead of tracebacks.

    ringtrain-launch [torchrun options] [ringtrain.main options]
    e.g. ringtrain-launch --standalone --nproc-per-node 3 --config configs/x.toml --resume

It starts ringtrain.main through torch's own launcher (torch.distributed.run: the same
options, rendezvous, worker management and signal forwarding as torchrun) and reports
how the run ended, once for the node, from what each rank wrote as it ended
(trainer/outcome.py):

- a stop (SIGTERM, Ctrl-C): the launcher passes the signal on to the ranks itself and
  waits for them however long their step takes (torch's launcher would SIGKILL them
  after its --shutdown-timeout, cutting a long step; the ranks bound a stop themselves:
  trainer/signals.py), then prints "stopped at step N ..., checkpoint ...: resume with
  ..." and exits 0 (a stop during start-up, with nothing trained, exits 128 + the signal
  number);
- a refusal (a bad config value, a resume mismatch): the message once, exit code 2;
- a failure: the rank that failed first, what happened to it and where its log is (a
  rank found hung or frozen by a peer is reported as that, not as the peer's kill), its
  exit code.

On its way out it removes the shared-memory objects of rings whose processes are all
dead (a run killed while creating its ring), as `ringtrain-stat --clean` does.

torch's launcher's own log lines (and its ChildFailedError report) stay off the console
unless LOGLEVEL is set (e.g. LOGLEVEL=INFO for rendezvous details). Plain `torchrun ... -m
ringtrain.main` works too; it prints torch's reports as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ringtrain.cli.train_args import build_parser
from ringtrain.interrupts import STOP_SIGNALS
from ringtrain.process_end import process_entry
from ringtrain.ring.names import remove_dead_runs
from ringtrain.trainer.outcome import OUTCOME_DIR_ENV, read_outcomes
from ringtrain.trainer.report import describe_end

PROGRAM = "ringtrain-launch"
MODULE = "ringtrain.main"
ENTRY_MODULE = "ringtrain.rank_entry"  # ringtrain.main, with start-up signals handled
# torch's launcher's loggers: their lines (worker shutdown notices, failure tables) stay
# off the console unless the user sets LOGLEVEL.
TORCH_LAUNCHER_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.distributed.run",
)
# The stop signals the launcher passes on itself; torch's launcher handles the others.
TORCH_HANDLED_SIGNALS = "SIGHUP,SIGQUIT"


class StopForwarder:
    """Passes SIGTERM and SIGINT on to the workers (this process's children) and lets the
    launch run on until they end; before any worker runs, a stop ends the launch as
    torch's launcher would (SignalException)."""

    def __init__(self) -> None:
        self.signal_name = ""

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._forward)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        workers = child_pids()
        if not workers:
            raise SignalException(f"{PROGRAM} got {name} before any rank started", signum)
        self.signal_name = self.signal_name or name
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def child_pids() -> list[int]:
    """The pids of this process's children (the workers torch's launcher started)."""
    me, children = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == me:
            children.append(int(entry.name))
    return children


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun's options, ringtrain.main's options): the split is at the first option of
    ringtrain.main (or at a lone `--`, which is dropped)."""
    main_options = {
        option for action in build_parser()._actions for option in action.option_strings
    } - {"-h", "--help"}
    for index, token in enumerate(argv):
        if token == "--":
            return list(argv[:index]), list(argv[index + 1 :])
        if token.split("=", 1)[0] in main_options:
            return list(argv[:index]), list(argv[index:])
    return list(argv), []


def torchrun_arguments(argv: Sequence[str]):
    """torch's launcher's parsed arguments for running ringtrain.main with `argv`'s options;
    SystemExit(2) with a message when the torchrun part names a script of its own."""
    launcher_part, main_part = split_arguments(argv)
    args = torch_run.parse_args([*launcher_part, "-m", ENTRY_MODULE])
    if args.training_script_args or args.training_script != ENTRY_MODULE:
        # What the user gave, without the "-m ENTRY_MODULE" appended above.
        given = shlex.join([args.training_script, *args.training_script_args][:-2])
        raise SystemExit(
            f"{PROGRAM}: {given!r} is not an option of torchrun or of {MODULE}; "
            f"{PROGRAM} starts {MODULE} itself: give torchrun's options, then {MODULE}'s "
            f"(e.g. {PROGRAM} --standalone --nproc-per-node 3 --config FILE)"
        )
    build_parser().parse_args(main_part)  # a usage error once here, not once per rank
    args.training_script_args = main_part
    return args


def resume_command(argv: Sequence[str]) -> str:
    """This launch's command line as it resumes: with --resume, without --overwrite."""
    kept = [token for token in argv if token != "--overwrite"]
    return shlex.join([PROGRAM, *kept, *([] if "--resume" in kept else ["--resume"])])


def quiet_torch_launcher() -> None:
    """Keep torch's launcher's log lines off the console (unless LOGLEVEL is set)."""
    if os.environ.get("LOGLEVEL"):
        return
    for name in TORCH_LAUNCHER_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def launch(argv: Sequence[str]) -> int:
    """Run the workers to their end and report it; returns the launcher's exit code."""
    args = torchrun_arguments(argv)
    local_ranks = torch_run.determine_local_world_size(args.nproc_per_node)
    quiet_torch_launcher()
    forwarder = StopForwarder()
    if hasattr(args, "signals_to_handle"):  # this torch lets the launcher keep the stops
        args.signals_to_handle = TORCH_HANDLED_SIGNALS
        forwarder.install()
    with tempfile.TemporaryDirectory(prefix="ringtrain-outcomes-") as directory:
        os.environ[OUTCOME_DIR_ENV] = directory
        if not args.log_dir:
            # torch's launcher would make a torchelastic_* directory of its own for its
            # per-rank error files and leave it behind, one per launch; this one goes
            # with the outcomes. A --log-dir given is kept.
            args.log_dir = os.path.join(directory, "torch-launcher")
        signal_name, failures = "", {}
        try:
            torch_run.run(args)
        except SignalException as exc:
            signal_name = exc.sigval.name
        except ChildFailedError as exc:
            failures = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        outcomes = read_outcomes(Path(directory))
    remove_dead_runs()
    signal_name = signal_name or forwarder.signal_name
    code, line = describe_end(outcomes, local_ranks, failures, signal_name, resume_command(argv))
    if line:
        print(f"ringtrain: {line}", file=sys.stderr if code else sys.stdout, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n", 2)[1])
        print(f"torchrun options: see torchrun --help. {MODULE} options:")
        build_parser().print_help()
        return 0
    return launch(argv)


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
