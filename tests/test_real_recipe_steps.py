"""The real-model recipes' own steps: the prompts step runs its synthesis processes at once
and stops them when it fails, the training split is regenerated in the batches the
settings ask for, a training cut short continues from its checkpoint and counts the
seconds of both calls, and the variants' report keeps every trained variant when the
evaluations are cut short."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from transformers import AutoTokenizer

from ringtrain.config import load_config
from ringtrain.generate.chat import ChatRenderer
from ringtrain.target.tiny import build_tiny_target
from tools.recipes import real_eval, real_prompts, real_recipe, real_report, real_variants
from tools.recipes import regenerate as recipe_regenerate
from tools.recipes.real_base import ROOT, RealRecipe, RealRecipeSettings, Timed
from tools.recipes.real_prompts import Synthesis

# A stand-in for `ringtrain-data synthesize`: marks itself started and running; "together":
# waits until every part has started (a barrier with a deadline: the parts must run at
# once); "alone": fails if another part is running. Then writes its conversations and a
# summary line, as the real command does, and is no longer running.
PART = """
import json, sys, time
from pathlib import Path
output, count, parts, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
running = list(output.parent.glob("*.running"))
if mode == "alone" and running:
    sys.exit(f"{output.stem} started beside {running}")
mark = output.with_suffix(".running")
mark.touch()
output.with_suffix(".started").touch()
deadline = time.monotonic() + 60
while mode == "together" and len(list(output.parent.glob("*.started"))) < parts:
    if time.monotonic() > deadline:
        sys.exit("the other parts never started")
    time.sleep(0.01)
rows = [{"messages": [{"role": "user", "content": f"{output.stem} {i}"}]} for i in range(count)]
output.write_text("".join(json.dumps(row) + "\\n" for row in rows))
print(f"{output}: {count} conversations written")
mark.unlink()
"""


def stand_in_commands(target, parts, synthesis, seed, device, output):
    """The stand-in for every part, where the real commands would write: on a GPU the
    parts must run together, on a CPU alone."""
    mode = "alone" if device == "cpu" else "together"
    return {
        name: [sys.executable, "-c", PART, str(real_prompts.part_file(output, name)),
               str(count), str(len(parts)), mode]
        for name, (count, _turns) in parts.items()
    }  # fmt: skip


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_synthesis_parts_run_at_once_on_a_gpu_and_one_by_one_on_a_cpu(
    device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(real_prompts, "synthesis_commands", stand_in_commands)
    output = tmp_path / "train-prompts.jsonl"
    counts = real_prompts.general_prompts(
        tmp_path / "model", 40, Synthesis(0.5, two_turn=0.4), 0, device, output
    )
    assert counts == {"code": 20, "synthesized": 12, "synthesized_two_turn": 8}
    mixed = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(mixed) == 40
    assert json.loads(output.with_suffix(".sources.json").read_text()) == counts


def test_a_failed_prompts_step_stops_its_synthesis_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[subprocess.Popen] = []

    def start_all(commands, cwd):
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
            )
            for name in commands
        }
        started.extend(procs.values())
        return procs

    def broken_code_prompts(count: int, seed: int, output: Path) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(real_prompts, "start_all", start_all)
    monkeypatch.setattr(real_prompts, "code_prompts", broken_code_prompts)
    with pytest.raises(OSError, match="disk full"):
        real_prompts.general_prompts(
            tmp_path / "model", 10, Synthesis(0.5, two_turn=0.4), 0, "cuda", tmp_path / "p.jsonl"
        )
    # Without the stop they would wait on their input for ever.
    assert len(started) == 2
    assert all(proc.poll() is not None for proc in started)


def test_the_variants_report_keeps_every_trained_variant_when_evaluation_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = SimpleNamespace(
        config=SimpleNamespace(run=SimpleNamespace(run_dir=str(tmp_path / "runs" / "smollm2"))),
        timings={},
    )
    settings = real_variants.VariantsSettings(
        steps=10, parallel=3, variants={"best": [], "code_only": [], "synth_only": []}
    )

    def train_group(recipe, settings, group):
        return {name: {"run_dir": name, "held_out": {"tau_sim": 2.0}} for name in group}

    evaluated = []

    def evaluate_variant(recipe, settings, name, entry):
        if evaluated:
            raise KeyboardInterrupt  # the device's time ran out during the second
        evaluated.append(name)
        return {"eval": {"tau_real": 2.5}}

    monkeypatch.setattr(real_variants, "train_group", train_group)
    monkeypatch.setattr(real_variants, "evaluate_variant", evaluate_variant)
    monkeypatch.delenv("OUT", raising=False)
    report: dict = {"variants": {}}
    with pytest.raises(KeyboardInterrupt):
        real_variants.run_groups(
            recipe, settings, dict.fromkeys(settings.variants, ([], None)), report, 0.0
        )
    saved = json.loads((tmp_path / "runs" / "smollm2-variants" / "real_variants.json").read_text())
    assert {name: entry["held_out"]["tau_sim"] for name, entry in saved["variants"].items()} == {
        "best": 2.0,
        "code_only": 2.0,
        "synth_only": 2.0,
    }
    assert saved["variants"]["best"]["eval"] == {"tau_real": 2.5}
    assert "eval" not in saved["variants"]["code_only"]


def test_a_variant_trained_to_the_end_is_reused_and_so_is_its_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """real_variants as several device calls: a variant an earlier run trained to the end
    with the same command is not trained again, a failed one is; the evaluation of a
    reused variant by the same command is reused, a retrained one's is not."""
    recipe = cpu_recipe(tmp_path, [f"run.run_dir={json.dumps(str(tmp_path / 'runs' / 'r'))}"])
    settings = real_variants.VariantsSettings(
        steps=4, parallel=2, variants={"best": [], "code_only": []}
    )
    group = {name: ([], recipe.config) for name in settings.variants}
    trained: list[str] = []
    failing = {"code_only"}

    def run_children(commands):
        for name in commands:
            variant = name.removeprefix("train_")
            trained.append(variant)
            run_dir = real_variants.variants_dir(recipe) / variant
            run_dir.mkdir(parents=True, exist_ok=True)
            records = [{"event": "step", "tokens": 100, "seconds": 0.5}]
            records.append({"event": "eval", "tau_sim": 2.0})
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return {
            name: subprocess.CompletedProcess(c, int(name.endswith(tuple(failing))), "", "")
            for name, c in commands.items()
        }

    evaluations: list[str] = []

    def run_all(commands, cwd):
        evaluations.extend(commands)
        out = json.dumps({"tau_real": 2.5, "prompts": 4})
        return {name: subprocess.CompletedProcess(c, 0, out, "") for name, c in commands.items()}

    monkeypatch.setattr(real_variants, "run_children", run_children)
    monkeypatch.setattr(real_eval, "run_all", run_all)
    first = real_variants.train_group(recipe, settings, group)
    assert "error" in first["code_only"] and first["best"]["train_tokens_per_s"] == 200.0
    assert (
        real_variants.evaluate_variant(recipe, settings, "best", first["best"])["eval"]["tau_real"]
        == 2.5
    )

    failing.clear()
    second = real_variants.train_group(recipe, settings, group)
    assert trained == ["best", "code_only", "code_only"]
    assert second["best"]["reused"] and second["best"]["held_out"] == {
        "event": "eval", "tau_sim": 2.0,
    }  # fmt: skip
    assert "reused" not in second["code_only"] and "error" not in second["code_only"]
    for name in settings.variants:
        result = real_variants.evaluate_variant(recipe, settings, name, second[name])
        assert result["eval"]["tau_real"] == 2.5
    # best's first evaluation reused; code_only evaluated once, as it was retrained.
    assert [name.rsplit("_", 1)[0] for name in evaluations] == ["eval_best", "eval_code_only"]
    limited = msgspec.structs.replace(settings, eval_limit=4)
    real_variants.evaluate_variant(recipe, limited, "best", second["best"])  # another --limit
    assert len(evaluations) == 3
    # The data step ran again with other settings (the same paths, other answers): both
    # variants train again.
    made_by = recipe.dataset("train") / "recipe.json"
    made_by.parent.mkdir(parents=True, exist_ok=True)
    made_by.write_text(json.dumps({"command": ["--sampled-fraction", "0.5"]}) + "\n")
    third = real_variants.train_group(recipe, settings, group)
    assert trained[3:] == ["best", "code_only"] and not any("reused" in e for e in third.values())


def test_the_recipe_regenerates_its_training_split_in_the_batches_it_asks_for(
    tmp_path: Path,
) -> None:
    settings = RealRecipeSettings(
        config="c.toml", train_prompts=[8], max_new_tokens=16, regen_dtype="bfloat16",
        regen_batch_size=4096, regen_batch_tokens=1 << 20,
    )  # fmt: skip
    recipe = SimpleNamespace(
        settings=settings, target=tmp_path / "model", device="cuda",
        prompts=lambda split: tmp_path / f"{split}.jsonl",
        dataset=lambda split: tmp_path / split,
    )  # fmt: skip
    train = real_recipe.regenerate_command(recipe, "train")
    assert train[train.index("--batch-size") + 1] == "4096"
    assert train[train.index("--max-batch-tokens") + 1] == str(1 << 20)
    # The 164 held-out problems fit one batch as they are.
    held_out = real_recipe.regenerate_command(recipe, "eval")
    assert "--batch-size" not in held_out and "--max-batch-tokens" not in held_out
    assert "--batch-size" not in real_recipe.regenerate_command(
        SimpleNamespace(**{**vars(recipe), "settings": RealRecipeSettings(
            config="c.toml", train_prompts=[8], max_new_tokens=16)}),
        "train",
    )  # fmt: skip


def test_a_training_cut_short_continues_from_its_checkpoint_and_a_finished_one_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's training step: a run it started with the same command and that
    stopped after a checkpoint (the end of a device session) continues with --resume; a
    finished one is reused; another command starts afresh."""
    run_dir = tmp_path / "runs" / "smollm2"
    recipe = cpu_recipe(tmp_path, [f"run.run_dir={json.dumps(str(run_dir))}"])
    launched: list[list[str]] = []
    exit_codes = iter([1, 0, 0])

    def run_children(commands):
        launched.extend(commands.values())
        return {
            name: subprocess.CompletedProcess(command, next(exit_codes), "", "")
            for name, command in commands.items()
        }

    def newest(root: Path) -> Path | None:
        return root / "step_00001000" if (root / "step_00001000").is_dir() else None

    monkeypatch.setattr(real_recipe, "run_children", run_children)
    monkeypatch.setattr(real_recipe, "latest_checkpoint", newest)
    with pytest.raises(SystemExit):  # stopped at step 1,000, its checkpoint written
        real_recipe.train(recipe)
    (run_dir / "checkpoints" / "step_00001000").mkdir(parents=True)
    real_recipe.train(recipe)
    real_recipe.train(recipe)  # finished: reused, nothing launched
    assert [command[-1] == "--resume" for command in launched] == [False, True]
    assert launched[1][:-1] == launched[0]
    # Another command (other overrides) does not continue that run: it starts afresh.
    recipe.overrides = ["run.max_steps=8"]
    real_recipe.train(recipe)
    assert launched[2][-1] != "--resume" and not (run_dir / "checkpoints").exists()


def test_a_recipe_run_as_several_calls_reports_the_seconds_of_the_steps_it_reused(
    tmp_path: Path,
) -> None:
    """Each step's seconds are kept beside the data when it finishes; a later run that
    reuses the step reports them, and the recipe's seconds line adds them to its own."""

    def recipe() -> RealRecipe:
        return cpu_recipe(tmp_path, [])

    first = recipe()
    with Timed(first, "data"):
        pass
    with pytest.raises(RuntimeError), Timed(first, "train"):
        raise RuntimeError("a step that failed is not reused, so its time is not kept")
    assert set(first.step_seconds()) == {"data"}

    later = recipe()
    later.reused("data")
    later.reused("train")
    assert later.earlier == {"data": first.step_seconds()["data"]}
    later.earlier["data"] = 234.0  # as the first call measured it on a GPU
    report = {
        "machine": "m", "device": "cuda", "date": "d", "regenerate": {},
        "earlier_s": later.earlier,
        "timings_s": {"eval": 231.0, "total": 231.2},
    }  # fmt: skip
    line = real_report.real_recipe_seconds_line(report, "m, d, `command`")
    assert line.startswith("- real_recipe_gpu_s: 465 (")
    assert "data 234 (an earlier call), eval 231" in line
    on_cpu = real_report.real_recipe_seconds_line({**report, "device": "cpu"}, "m, d, `c`")
    assert on_cpu.startswith("- real_recipe_cpu_s: 465 (")


def test_a_training_stopped_in_one_call_and_continued_in_the_next_counts_both_calls(
    tmp_path: Path,
) -> None:
    """A step stopped by SIGTERM (a device call's end) keeps its seconds as stopped ones;
    the run that continues it adds them to its own and reports them as an earlier call's;
    a run that starts the step afresh does not; a failure keeps nothing."""
    first = cpu_recipe(tmp_path, [])
    with pytest.raises(SystemExit), Timed(first, "train"):
        raise SystemExit(143)
    stopped = first.step_seconds()["train (stopped)"]
    assert "train" not in first.step_seconds()
    first.seconds_file.write_text(json.dumps({"train (stopped)": 560.0}) + "\n")

    afresh = cpu_recipe(tmp_path, [])
    with pytest.raises(RuntimeError), Timed(afresh, "train", continues=True):
        raise RuntimeError("a failed continuation keeps nothing")
    assert afresh.step_seconds() == {} and stopped >= 0

    first.seconds_file.write_text(json.dumps({"train (stopped)": 560.0}) + "\n")
    later = cpu_recipe(tmp_path, [])
    with Timed(later, "train", continues=True):
        pass
    assert later.earlier == {"train (stopped)": 560.0}
    assert 560.0 <= later.step_seconds()["train"] < 570.0
    assert "train (stopped)" not in later.step_seconds()

    first.seconds_file.write_text(json.dumps({"train (stopped)": 560.0}) + "\n")
    restarted = cpu_recipe(tmp_path, [])
    with Timed(restarted, "train"):
        pass
    assert restarted.earlier == {} and restarted.step_seconds()["train"] < 10.0


def cpu_recipe(tmp_path: Path, overrides: list[str]) -> RealRecipe:
    """A recipe on the CPU whose data (and its seconds file) lie under ``tmp_path``."""
    settings = RealRecipeSettings(
        config="configs/smollm2-135m.toml", train_prompts=[8], max_new_tokens=16
    )
    data = f"data.path={json.dumps(str(tmp_path / 'data' / 'train'))}"
    config = load_config(ROOT / settings.config, [data, *overrides])
    return RealRecipe("cpu", settings, config, [], fresh=False, gguf="")


def test_variants_are_evaluated_at_every_temperature_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With temperatures [0, 1] each variant is scored greedy and sampled by one
    ringtrain-eval run; the table and the BENCHMARKS.md lines show both."""
    recipe = cpu_recipe(tmp_path, [f"run.run_dir={json.dumps(str(tmp_path / 'runs' / 'r'))}"])
    settings = real_variants.VariantsSettings(steps=4, variants={"best": []}, temperatures=[1.0])
    drafter = tmp_path / "best"
    drafter.mkdir()
    runs: list[list[str]] = []

    def run_all(commands, cwd):
        runs.extend(commands.values())
        evaluations = [
            {"temperature": t, "tau_real": tau, "mismatches": [], "numerical_ties": 0, "prompts": 4,
             "benchmarks": {"humaneval": {"tau_real": tau, "prompts": 4, "speedup": 1.5}}}
            for t, tau in ((0.0, 3.0), (1.0, 1.75))
        ]  # fmt: skip
        out = json.dumps({"evaluations": evaluations})
        return {name: subprocess.CompletedProcess(c, 0, out, "") for name, c in commands.items()}

    monkeypatch.setattr(real_eval, "run_all", run_all)
    entry = {"run_dir": str(drafter), "held_out": {"tau_sim": 2.0}, "overrides": []}
    entry.update(real_variants.evaluate_variant(recipe, settings, "best", entry))
    (command,) = runs
    assert command[command.index("--temperature") :].count("--temperature") == 2
    dtype = entry["eval_dtype"]
    assert entry["eval"]["tau_real"] == 3.0
    assert entry["sampled"][f"{dtype}-t1"]["tau_real"] == 1.75
    report = {"machine": "m", "date": "d", "settings": {"steps": 4}, "variants": {"best": entry}}
    lines = real_variants.benchmark_lines(report, "cmd")
    assert [line.split(":")[0] for line in lines] == [
        "- tau_real_humaneval_best",
        "- tau_real_humaneval_t1_best",
    ]
    assert any(
        row.split()[:3] == ["humaneval", "best", "t1"] for row in real_variants.variant_rows(report)
    )


def test_a_recipe_setting_is_overridden_by_name_and_a_bad_one_refused() -> None:
    section = {"config": "configs/smollm2-135m.toml", "train_prompts": [8], "max_new_tokens": 16}
    settings = real_recipe.recipe_settings(
        section, ["sampled_fraction=0.5", 'eval_dtypes=["float32"]'], "[cpu]"
    )
    assert settings.sampled_fraction == 0.5 and settings.eval_dtypes == ["float32"]
    with pytest.raises(SystemExit, match=r"\[cpu\]: Object contains unknown field `sampled`"):
        real_recipe.recipe_settings(section, ["sampled=0.5"], "[cpu]")
    with pytest.raises(SystemExit, match=r"Expected `float` <= 1.0 - at `\$.sampled_fraction`"):
        real_recipe.recipe_settings(section, ["sampled_fraction=2"], "[cpu]")
    with pytest.raises(SystemExit, match="--setting 'sampled_fraction': give KEY=VALUE"):
        real_recipe.recipe_settings(section, ["sampled_fraction"], "[cpu]")


def test_the_recipes_regenerator_keeps_the_source_each_prompt_record_names(
    tmp_path: Path,
) -> None:
    target = build_tiny_target(tmp_path / "target", seed=1, hybrid=False, num_layers=2)
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(target))
    mixed, unnamed = tmp_path / "mixed.jsonl", tmp_path / "unnamed.jsonl"
    mixed.write_text(
        '{"prompt": "def add(a, b):", "source": "code"}\n'
        '{"prompt": "Write a haiku.", "source": "chat"}\n'
        '{"input_ids": [5, 6, 7], "source": "code"}\n'
    )
    unnamed.write_text('{"prompt": "def add(a, b):", "source": "code"}\n{"prompt": "Hi"}\n')

    def read(path: Path) -> tuple[list, list[str] | None]:
        args = SimpleNamespace(prompts=str(path), benchmark=None, limit=0)
        return recipe_regenerate.read_conversations(args, renderer, 512)

    conversations, sources = read(mixed)
    assert sources == ["code", "chat", "code"]
    assert len(conversations) == 3 and conversations[2].input_ids == [5, 6, 7]
    conversations, sources = read(unnamed)
    assert len(conversations) == 2 and sources is None


def test_a_timed_step_that_is_not_the_recipes_own_is_kept_out_of_its_seconds_file(
    tmp_path: Path,
) -> None:
    recipe = cpu_recipe(tmp_path, [])
    with Timed(recipe, "model"):
        pass
    with Timed(recipe, "train_best+code_only", recorded=False):
        pass

    assert set(recipe.step_seconds()) == {"model"}
    assert set(recipe.timings) == {"model", "train_best+code_only"}
