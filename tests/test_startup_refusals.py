"""Values that pass the config's bounds but cannot work are refused at start-up, and a
run that trained nothing fails.

What the drafter can hold (drafter/limits.py) is checked on the tiny drafter's spec; the
schedules' fractions when a config is parsed; the loop's verdict on a session whose
every step was skipped in process; and two refusals through ringtrain-launch (a real CPU
launch of the embedded default): exit code 2, one line, no traceback.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from ringtrain.config import Config, ConfigError, RunConfig, parse_config
from ringtrain.data.config import DataConfig
from ringtrain.drafter import drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.limits import check_limits
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.signals import StopRequest
from tests.helpers.drafter_loop_parts import RingStandIn, item, make_trainee
from tests.helpers.launcher import RUN_TIMEOUT_S, launch_command, run_env
from tests.helpers.tiny_drafter import MAX_TOKENS, TAPS, TARGET, make_cfg, paper_optim

CPU = torch.device("cpu")


def _check(drafter: DrafterConfig, optim: OptimConfig) -> None:
    spec = drafter_spec_from_target(TARGET, drafter, TAPS)
    check_limits(drafter, optim, spec, MAX_TOKENS, CPU)


def test_the_defaults_fit() -> None:
    _check(make_cfg(architecture="dflash2"), OptimConfig())
    _check(make_cfg(), paper_optim())


@pytest.mark.parametrize(
    ("drafter", "optim", "named"),
    [
        ({"architecture": "dflash2", "selector_rank": 100_000_000}, {}, "candidate_selector"),
        ({}, {"lr": 1e300, "name": "muon"}, r"optim.lr = 1e\+300: a step of lr x"),
        ({}, {"lr": 1e300, "name": "adamw"}, r"optim.lr = 1e\+300: a step of lr must"),
        ({"max_anchors": 1_000_000_000}, {}, "max_anchors=1000000000 exceeds the context"),
        ({"architecture": "dflash2", "selector_loss_weight": 1e300}, {}, "selector_loss_weight"),
    ],
)
def test_values_the_drafter_cannot_hold_are_named(drafter: dict, optim: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named) as refused:
        _check(make_cfg(**drafter), paper_optim(**optim))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["optim.warmup_fraction=1.0"], "optim.warmup_fraction = 1 \\+ optim.decay_fraction"),
        (["optim.warmup_fraction=0.5", "optim.decay_fraction=0.6"], "exceed 1"),
        (['optim.schedule="cosine"', "optim.warmup_fraction=1.0"], "no steps to decay"),
    ],
)
def test_schedule_fractions_without_room_for_the_decay_are_refused(
    overrides: list[str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config("", "run.toml", overrides)
    parse_config("", "run.toml", ['optim.schedule="cosine"', "optim.warmup_fraction=0.99"])


def test_a_session_whose_every_step_was_skipped_fails_without_a_final_checkpoint() -> None:
    config = Config(
        run=RunConfig(max_steps=2, eval_every=0, checkpoint_every=0),
        data=DataConfig(token_budget=MAX_TOKENS),
        drafter=make_cfg(),
        optim=paper_optim(lr=1e-2, warmup_fraction=0.0),
    )
    ring = RingStandIn([item(0, poison=True), item(1, poison=True)])
    loop = DrafterLoop(config, ring.take, ring, make_trainee(config), 0, 1, None, 0)
    saved: list[int] = []
    with pytest.raises(FloatingPointError, match="all 2 steps of this session were skipped"):
        loop.train(DrafterState(0, BatchLedger()), StopRequest(), save=lambda s: saved.append(s))
    assert saved == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("drafter.selector_rank=100000000", "candidate_selector.predecessor_codebook"),
        ("optim.warmup_fraction=1.0", "optim.warmup_fraction = 1"),
    ],
)
def test_a_refusal_through_the_launcher_is_one_line_and_exit_code_2(
    tmp_path, setting: str, named: str
) -> None:
    proc = subprocess.run(
        launch_command(tmp_path / "run", 1, 1, [setting, "run.max_steps=2"]),
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-4000:]
    lines = [line for line in text.splitlines() if line.startswith("ringtrain: ")]
    assert len(lines) == 1 and named in lines[0], text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
