"""The mutation check's table: each group of one-line changes (mutants) to one module that
computes what users read, with the tests that must notice them (check.py runs them). The
groups live in tools/mutation/groups/, a module per area of the project."""

from __future__ import annotations

from tools.mutation.groups import (
    arrow_files,
    chat_render,
    checkpoint_config,
    checkpoint_resume,
    command_lines,
    command_tools,
    corpus,
    data,
    drafter,
    drafter_spec,
    eval_drafting,
    eval_processes,
    evaluation,
    generate,
    local_model,
    mask_token,
    monitor_log,
    monitor_stat,
    regen_drivers,
    ring,
    ring_payload,
    run,
    run_signals,
    startup,
    synth_parts,
    synthesis,
    target,
    target_runner,
    target_structure,
    trainer_groups,
)

MUTANTS = (
    *evaluation.GROUPS, *generate.GROUPS, *data.GROUPS, *drafter.GROUPS, *target.GROUPS,
    *run.GROUPS, *ring.GROUPS, *startup.GROUPS, *synthesis.GROUPS,
    *command_lines.GROUPS, *monitor_stat.GROUPS, *checkpoint_config.GROUPS,
    *run_signals.GROUPS, *checkpoint_resume.GROUPS, *regen_drivers.GROUPS,
    *drafter_spec.GROUPS, *eval_processes.GROUPS, *local_model.GROUPS, *arrow_files.GROUPS,
    *chat_render.GROUPS, *mask_token.GROUPS, *corpus.GROUPS,
    *monitor_log.GROUPS, *synth_parts.GROUPS, *target_structure.GROUPS, *trainer_groups.GROUPS,
    *ring_payload.GROUPS, *eval_drafting.GROUPS, *target_runner.GROUPS, *command_tools.GROUPS,
)  # fmt: skip
