"""The command line of a training run: ringtrain.main's options, which ringtrain-launch
checks and passes on, and the ``--set`` option that every command starting a run takes.
It imports nothing heavy, so the launcher parses a command line without importing the
trainer (its ranks do that)."""

from __future__ import annotations

import argparse


def add_override_option(parser: argparse.ArgumentParser) -> None:
    """Add the ``--set SECTION.KEY=VALUE`` option (repeatable; into ``overrides``) that
    every command starting a training run takes."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set run.max_steps=10",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line of ringtrain.main (ringtrain-launch passes these options on)."""
    parser = argparse.ArgumentParser(
        prog="python -m ringtrain.main",
        description="Train a DFlash drafter (start through ringtrain-launch or torchrun).",
    )
    parser.add_argument("--config", help="TOML config (default: the embedded tiny run)")
    add_override_option(parser)
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run directory that holds an earlier run: deletes its "
        "checkpoints and metrics.jsonl first (without it such a start is refused)",
    )
    return parser
