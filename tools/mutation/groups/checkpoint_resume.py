"""The mutants of exact resume: what a checkpoint records of the run, how a resume reads it back and what it loads (ringtrain/checkpoint/resume_record.py, resume.py, load.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

RECORD_TESTS = (
    "tests/test_resume_record.py", "tests/test_resume_identity.py",
    "tests/test_drafter_checkpoint.py", "tests/test_checkpoint_verify.py", "tests/test_choices.py",
)  # fmt: skip
RESUME_TESTS = (
    "tests/test_resume_record.py", "tests/test_drafter_checkpoint.py",
    "tests/test_checkpoint_safety.py", "tests/test_optim_choices.py",
)  # fmt: skip
LOAD_TESTS = (
    "tests/test_drafter_checkpoint.py", "tests/test_checkpoint_verify.py",
    "tests/test_checkpoint_safety.py", "tests/test_optim_choices.py",
)  # fmt: skip

GROUPS = (
    Group("resume record", "ringtrain/checkpoint/resume_record.py", RECORD_TESTS, (
        Mutant("a record of another version read as this one",
               "    if version != RECORD_VERSION:\n", "    if version is None:\n"),
        Mutant("a JSON file other than an object read for its version",
               'version = raw.get("version") if isinstance(raw, dict) else None',
               'version = raw.get("version")'),
        Mutant("a file that is not JSON reported as msgspec's error",
               "    except msgspec.DecodeError as exc:\n",
               "    except msgspec.ValidationError as exc:\n"),
        Mutant("a record of wrong fields reported as msgspec's error",
               "    except msgspec.ValidationError as exc:\n",
               "    except msgspec.EncodeError as exc:\n"),
        Mutant("unknown fields of a record ignored",
               "class ResumeRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):",
               "class ResumeRecord(msgspec.Struct, frozen=True, kw_only=True):"),
        Mutant("a held-out round due after step 0 read as the checkpoint's step",
               "return self.step if self.eval_step is None else self.eval_step",
               "return self.eval_step or self.step"),
        Mutant("the recorded settings named in alphabetical order",
               "for name in StreamIdentity.__struct_fields__",
               "for name in sorted(StreamIdentity.__struct_fields__)"),
    )),
    Group("resume training", "ringtrain/checkpoint/resume.py", RESUME_TESTS, (
        Mutant("one checkpoint more kept than run.keep_checkpoints",
               "prune_checkpoints(root, keep, path)", "prune_checkpoints(root, keep + 1, path)"),
        Mutant("the weights not loaded",
               "    model.load_state_dict(checkpoint.model.state_dict())\n", ""),
        Mutant("the RNG states not restored", "    checkpoint.restore(optimizer)\n",
               "    checkpoint.restore(optimizer, rng=False)\n"),
        Mutant("the config's optimiser settings not applied",
               "changes = resume_settings(optimizer, cfg, checkpoint.saved_schedule)",
               "changes = []"),
        Mutant("a changed run.max_steps not reported",
               "    if saved_total is not None and saved_total != total_steps:\n",
               "    if False:\n"),
        Mutant("the schedule placed a step early",
               "scheduler = schedule_at(optimizer, cfg, total_steps, checkpoint.step)",
               "scheduler = schedule_at(optimizer, cfg, total_steps, checkpoint.step - 1)"),
    )),
    Group("checkpoint load", "ringtrain/checkpoint/load.py", LOAD_TESTS, (
        Mutant("a checkpoints root read as a checkpoint directory",
               "    if not (path / CONFIG_FILE).is_file():\n", "    if False:\n"),
        Mutant("the weights built but not read",
               "        model.load_state_dict(load_file(str(path / WEIGHTS_FILE), device=str(device)))\n",
               ""),
        Mutant("the optimiser state not restored",
               '        optimizer.load_state_dict(self.training_state["optimizer"])\n', ""),
        Mutant("the RNG states never restored", "        if rng:\n", "        if False:\n"),
        Mutant("the scheduler's state read as the optimiser's",
               'return load_state(Path(checkpoint) / STATE_FILE, mmap=True)["optimizer"]',
               'return load_state(Path(checkpoint) / STATE_FILE, mmap=True)["scheduler"]'),
    )),
)  # fmt: skip
