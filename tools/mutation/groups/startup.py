"""The mutants of a run's start and stop: the plan's checks and the values every rank
derives from it (trainer/plan.py), and what a stop signal does before and during training
(trainer/signals.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

PLAN_TESTS = (
    "tests/test_preflight.py", "tests/test_mask_token.py", "tests/test_target_groups.py",
    "tests/test_resume_guard.py",
)  # fmt: skip
STOP_TESTS = ("tests/test_ring_failures.py", "tests/test_launch.py")

GROUPS = (
    Group("run plan", "ringtrain/trainer/plan.py", PLAN_TESTS, (
        Mutant("evaluation asked without a held-out split",
               "if config.run.eval_every and eval_dataset is None:", "if False:"),
        Mutant("a row longer than the budget accepted",
               "if config.data.max_len > config.data.token_budget:", "if False:"),
        Mutant("a resume's auto mask token not the checkpoint's",
               "if resumed_mask is not None and resumed_mask < vocab_size:", "if False:"),
        Mutant("another target's mask token resumed",
               "if resumed_mask is not None and resumed_mask < vocab_size:",
               "if resumed_mask is not None:"),
        Mutant("a resume not checked", "    if checkpoint is not None:\n        check_resume(",
               "    if False:\n        check_resume("),
        Mutant("the drafter's limits not checked",
               "        check_limits(config.drafter, config.optim, spec, config.data.token_budget, info.device)",
               "        pass"),
        Mutant("slots sized by the training split only",
               "for split in splits)", "for split in splits[:1])"),
        Mutant("the held-out split's batches not checked",
               "    for split in splits:\n", "    for split in splits[:1]:\n"),
        Mutant("the ring of every session the first one's", "generation=info.restart_count,",
               "generation=0,"),
        Mutant("every node's ranks numbered from 0",
               "first = info.node_rank * info.local_world_size", "first = 0"),
        Mutant("a target group's split not checked", "if config.layout.target_tp > 1:",
               "if False:"),
        Mutant("an evaluation round of one producer",
               "return batch_stream(config, plan.eval_dataset, 0, producers).batches_per_rank * producers",
               "return batch_stream(config, plan.eval_dataset, 0, producers).batches_per_rank"),
        Mutant("the configured tap layers ignored",
               "taps = config.target.tap_layers or default_tap_layers(",
               "taps = default_tap_layers("),
        Mutant("a missing lock directory found late", "if not Path(ring.lock_dir).is_dir():",
               "if False:"),
    )),
    Group("stop signals", "ringtrain/trainer/signals.py", STOP_TESTS, (
        Mutant("a stop's bound of one step", "limit_s = STOP_STEPS * step_s + checkpoint_s",
               "limit_s = step_s + checkpoint_s"),
        Mutant("a stop in training leaves at once",
               "if not any(ring.own_row.worked for ring in rings):", "if True:"),
        Mutant("a stop in start-up waits for a safe point",
               "if not any(ring.own_row.worked for ring in rings):", "if False:"),
        Mutant("a peer's death not reported on a stop",
               "                ring.react_to_peer_failure()\n", "                pass\n"),
        Mutant("a said outcome replaced by the stop", "if outcome_reported():", "if False:"),
        Mutant("the peers not told of a failed stop",
               "    for ring in open_rings():\n        ring.fail(message)",
               "    for ring in []:\n        ring.fail(message)"),
        Mutant("a failed stop exits 0", "    os._exit(1)", "    os._exit(0)"),
        Mutant("a stop in start-up exits 1", "os._exit(128 + signum)", "os._exit(1)"),
        Mutant("a stop in start-up leaves the ring failed", "ring.close(clean=True)",
               "ring.close(clean=False)"),
    )),
)  # fmt: skip
