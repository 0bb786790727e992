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
    corpus,
    data,
    drafter,
    drafter_spec,
    eval_processes,
    evaluation,
    generate,
    local_model,
    mask_token,
    monitor_log,
    monitor_stat,
    regen_drivers,
    ring,
    run,
    run_signals,
    startup,
    synth_parts,
    synthesis,
    target,
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
)  # fmt: skip
