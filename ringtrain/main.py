"""Entry point: `ringtrain-launch --nproc-per-node P [--config FILE] [--resume]`
(ringtrain/launch.py), or
`torchrun --nproc-per-node P -m ringtrain.main [--config FILE] [--resume]`.

Every process reads the same config, learns its role from its local rank (targets first,
then drafters), validates all inputs before touching a GPU, joins the node's ring, and
runs its role's loop. Without --config it trains the embedded default (ringtrain/tiny.toml):
a tiny hybrid target and a synthetic dataset, built in the run directory on first use.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from datetime import timedelta
from importlib import resources
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from ringtrain.cli.train_args import build_parser
from ringtrain.compile_caches import set_compile_caches
from ringtrain.config import (
    Config,
    ConfigError,
    dump_config,
    load_config,
    parse_config,
)
from ringtrain.cpu_math import settle_cpu_math
from ringtrain.process_end import end_process
from ringtrain.ring import PeerDied
from ringtrain.trainer.context import SessionContext
from ringtrain.trainer.groups import RankGroups, close_groups, gloo_only, new_groups
from ringtrain.trainer.logs import (
    FILE_ONLY,
    get_logger,
    setup_logging,
    silence_kernel_fallbacks,
)
from ringtrain.trainer.memory_fault import is_out_of_memory, out_of_memory_message
from ringtrain.trainer.outcome import (
    FAILED,
    REFUSED,
    Outcome,
    env_rank,
    launched,
    peer_failure,
    report_outcome,
)
from ringtrain.trainer.plan import INPUT_ERRORS, validate_inputs
from ringtrain.trainer.roles import RankInfo, rank_info_from_env
from ringtrain.trainer.run_dir import claim_run_dir, prepare_run_dir
from ringtrain.trainer.session import run_session
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.startup import bytecode_advice, process_age_s, started_in

# How long a rank that shares a start-up refusal waits for the launcher to stop it (refuse).
REFUSAL_GRACE_S = 30.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def read_config(args: argparse.Namespace) -> Config:
    """The config file named on the command line, or the embedded default (whose role
    split follows the number of processes torchrun started, unless --set gives one)."""
    if args.config:
        return load_config(args.config, args.overrides)
    text = resources.files("ringtrain").joinpath("tiny.toml").read_text(encoding="utf-8")
    overrides = list(args.overrides)
    if not any(o.strip().startswith("layout.") for o in overrides):
        overrides = embedded_split(int(os.environ.get("LOCAL_WORLD_SIZE", "3"))) + overrides
    return parse_config(text, "<embedded tiny.toml>", overrides)


def embedded_split(processes: int) -> list[str]:
    """The embedded default's role split for ``processes`` per node: about one target per
    three processes (2 -> 1+1, 3 -> 1+2, 8 -> 3+5), at least one of each. The tiny
    target's forward is cheap next to a drafter's training step, so drafters get most."""
    if processes < 2:
        raise ConfigError(
            f"the embedded default needs at least 2 processes per node (a target and a "
            f"drafter); torchrun started {processes}: use --nproc-per-node 2 or more"
        )
    targets = max(1, round(processes / 3))
    return [
        f"layout.targets_per_node={targets}",
        f"layout.drafters_per_node={processes - targets}",
    ]


def check_run_dir(run_dir: Path) -> None:
    """Raise ConfigError unless the run directory can be created and written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"run.run_dir = {str(run_dir)!r} cannot be written ({exc.strerror}); choose a "
            f"writable directory (--set run.run_dir=...)"
        ) from None


def refuse(exc: Exception, reporter: bool) -> int:
    """Say why start-up is refused, once, and return exit code 2.

    Under ringtrain-launch every rank reports the refusal as its outcome and the launcher
    prints it once. Under plain torchrun every rank refuses alike, so only the
    ``reporter`` prints at once. The others must not exit first: torchrun stops the
    remaining workers as soon as one fails, which could end the reporter before it has
    printed. They wait (at most REFUSAL_GRACE_S) for the launcher to stop them; a rank
    still running after that refused alone and says why."""
    if launched():
        report_outcome(Outcome(env_rank(), 2, REFUSED, f"{exc}"))
        return 2
    if not reporter:
        time.sleep(REFUSAL_GRACE_S)
    print(f"ringtrain: {exc}", file=sys.stderr)
    return 2


def init_distributed(info: RankInfo) -> RankGroups:
    """Join the world (gloo, start-up barriers only) and create the run's groups: the
    drafters' gradient group and the target groups (trainer/groups.py)."""
    dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    return new_groups(info)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = read_config(args)
        info = rank_info_from_env(config.layout, config.run.device)
        run_dir = Path(config.run.run_dir).expanduser().resolve()
        check_run_dir(run_dir)
    except ConfigError as exc:
        return refuse(exc, reporter=env_rank() == 0)
    try:
        notes = claim_run_dir(run_dir, info, resume=args.resume, overwrite=args.overwrite)
    except ConfigError as exc:  # the lock and its refusals are local rank 0's to report
        return refuse(exc, reporter=info.local_rank == 0)
    settle_cpu_math()
    log_path = setup_logging(run_dir, info.rank, info.role, terminal_progress=info.is_lead_drafter)
    if info.device.type == "cpu" or config.target.linear_attention == "torch":
        silence_kernel_fallbacks()
    log = get_logger()
    age_s = process_age_s()
    log.info("%s on %s; log file %s%s", info.tag, info.device, log_path, started_in(age_s))
    if advice := bytecode_advice(age_s, torch):
        log.info("%s", advice)
    for note in notes:
        log.info("%s", note)
    set_compile_caches(config)
    stop = StopRequest()
    stop.install()
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
    try:
        plan = validate_inputs(config, info, run_dir, resume=args.resume)
        for note in prepare_run_dir(run_dir, info, resume=args.resume, overwrite=args.overwrite):
            log.info("%s", note)
    except INPUT_ERRORS as exc:
        log.error("%s", exc, extra=FILE_ONLY)  # refuse() says it on the console, once
        return refuse(exc, reporter=info.local_rank == 0)
    if info.rank == 0:
        (run_dir / "config.json").write_bytes(dump_config(config))
    # Under ringtrain-launch the launcher prints one line for the run; details stay in logs.
    console = FILE_ONLY if launched() else None
    try:
        groups = init_distributed(info)
        outcome = run_session(SessionContext(config, info, run_dir, plan, groups, stop))
        if outcome.code == 0 and gloo_only(groups):
            close_groups()
    except PeerDied as exc:  # another rank failed first: name it and point at its log
        log.error("%s; stopping this rank", exc, extra=console)
        report_outcome(peer_failure(info.rank, exc, run_dir, log_path))
        return 1
    except Exception as exc:
        log.error("%s failed: %s\n%s", info.tag, exc, traceback.format_exc(), extra=console)
        failure = f"{info.tag} failed: {exc}"
        if is_out_of_memory(exc):  # what to change, not only what failed to allocate
            failure = out_of_memory_message(exc, info, config)
            log.error("%s", failure, extra=console)
        report_outcome(Outcome(info.rank, 1, FAILED, failure, log=str(log_path)))
        return 1
    report_outcome(msgspec.structs.replace(outcome, log=str(log_path)))
    log.info("%s exiting with code %d", info.tag, outcome.code)
    return outcome.code


if __name__ == "__main__":
    end_process(main())
