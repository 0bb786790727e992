"""Smoke runs of every benchmark and recipe script in tools/ on the CPU, at tiny sizes.

Each test runs a script the way a user does (by its path from another directory, or as
a module from the root, in a process of its own) and checks what it reports, not only
that it exits. Runs that take minutes on a small CPU machine are marked `scripts`: they are left
out of the suite by default and run with `bash tools/test.sh --scripts`;
scripts that only make sense on CUDA check their refusal here and run under the gpu mark.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ringtrain.data.sources import source_counts
from ringtrain.monitor.advice import MeasuredRates, advise
from ringtrain.trainer.logs import LOGGER_NAME, rank_log_path, setup_logging
from tests.helpers.at_once import run_at_once
from tests.helpers.launcher import RUN_TIMEOUT_S, run_env
from tools.bench.pipeline_layout import first_log_time, split_advice
from tools.mutation.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """A child's environment with the project root on PYTHONPATH (tools/ is not installed)."""
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _run(command: list[str], cwd: Path) -> dict:
    """Run a script; its last output line, parsed as JSON."""
    proc = subprocess.run(
        [sys.executable, *command], cwd=cwd, env=_env(), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_mutant_of_the_mutation_check_finds_its_line_once() -> None:
    """The mutation check changes lines by their text: one that code changed since no
    longer exists, and the check would stop there (it runs outside the suite)."""
    missing = [
        f"{group.module}: {mutant.label!r}"
        for group in MUTANTS
        for mutant in group.mutants
        if (ROOT / group.module).read_text().count(mutant.old) != 1
    ]
    assert not missing, "mutants whose text is not in their module once: " + "; ".join(missing)
    tests = {test for group in MUTANTS for test in group.tests}
    assert all((ROOT / test).is_file() for test in tests), tests


def test_bench_data_runs_by_its_path_from_another_directory(tmp_path: Path) -> None:
    script = ROOT / "tools" / "bench" / "bench_data.py"
    report = _run(
        [str(script), "--rows", "300", "--mean-len", "200", "--budget", "2048",
         "--max-len", "1024", "--batches", "20", "--json"],
        cwd=tmp_path,
    )  # fmt: skip
    assert (report["rows"], report["batches"]) == (300, 20)
    assert 0 < report["tokens_per_batch"] <= 2048
    assert 0 <= report["padding_fraction"] < 1


def test_moe_report_runs_as_a_module_and_reads_the_gpu_check_results(tmp_path: Path) -> None:
    (tmp_path / "target_moe.json").write_text(
        json.dumps({"results": [
            {"shape": "qwen3-30b-a3b", "out": "device", "tokens_per_s": 5000.0, "mfu": 0.3,
             "profile": [{"kernel": "gemm", "share": 0.5, "ms_per_step": 2.0}]},
            {"shape": "qwen3-30b-a3b", "out": "host", "tokens_per_s": 4000.0},
        ]})
    )  # fmt: skip
    (tmp_path / "bench_load.json").write_text(json.dumps({"target_load_gbps": 3.5}))
    env_out = {"OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.moe_report"], cwd=ROOT, env={**_env(), **env_out},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["target_moe_tokens_per_s"] == 5000.0
    assert report["target_moe_host_out_tokens_per_s"] == 4000.0
    assert report["target_moe_top_kernels"] == ["50% 2.0 ms gemm"]
    assert report["target_load_gbps"] == 3.5
    assert report["pipeline_efficiency_moe"] is None  # pipeline_moe.json is missing
    assert json.loads((tmp_path / "moe_report.json").read_text()) == report


MPS_STEPS = """
import runpy
mps_daemon = runpy.run_path("tools/recipes/mps.py")["mps_daemon"]
with mps_daemon(True) as outer:
    with mps_daemon(True) as inner, mps_daemon(False) as unwanted:
        print("inside", outer, inner, unwanted, flush=True)
    print("between", flush=True)
    with mps_daemon(True) as again:
        print("again", again, flush=True)
with mps_daemon(True) as fresh:
    print("fresh", fresh, flush=True)
"""


@pytest.mark.parametrize("starts", [True, False])
def test_mps_daemon_is_held_across_nested_steps(tmp_path: Path, starts: bool) -> None:
    """Steps inside a step under the MPS daemon keep its daemon (no stop and start
    between them); a daemon that does not start is said and the steps run without."""
    calls = tmp_path / "calls"
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir()
    control.write_text(
        f'#!/bin/sh\necho "${{1:-$(cat)}}" >> {calls}\n'
        + ("exit 0\n" if starts else 'echo "permission denied" >&2; exit 1\n')
    )
    control.chmod(0o755)
    env = {**_env(), "PATH": f"{control.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-c", MPS_STEPS], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    if starts:
        assert proc.stdout.splitlines() == [
            "inside True True False", "between", "again True", "fresh True"
        ]  # fmt: skip
        assert calls.read_text().split() == ["-d", "quit", "-d", "quit"]
    else:
        assert proc.stdout.splitlines()[0] == "inside False False False"
        assert "daemon not started here (permission denied): running without" in proc.stderr
        assert calls.read_text().split() == ["-d"] * 4  # each step tried, none stopped


def test_speed_report_sets_old_and_new_side_by_side_with_ratios(tmp_path: Path) -> None:
    (tmp_path / "speed_drafter.json").write_text(
        json.dumps({"results": [
            {"variant": "base", "step_s": 0.4, "mfu": 0.5, "final_loss": 9.0, "recompiles": 0},
            {"variant": "fast_step", "step_s": 0.3, "mfu": 0.6, "final_loss": 9.0, "recompiles": 0},
            {"variant": "muon", "error": "RuntimeError: out of memory"},
        ]})
    )  # fmt: skip
    (tmp_path / "speed_moe.json").write_text(
        json.dumps({"results": [
            {"moe_compile": "off", "out": "device", "step_ms": 200.0, "graph_breaks": 0},
            {"moe_compile": "off", "out": "host", "step_ms": 210.0},
            {"moe_compile": "on", "out": "device", "step_ms": 150.0, "graph_breaks": 0},
        ]})
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.speed_report"], cwd=ROOT,
        env={**_env(), "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[0])
    rows = {e["metric"]: e for e in report["comparison"]}
    assert rows["drafter.fast_step.step_s"]["ratio"] == pytest.approx(0.75)
    assert rows["drafter.fast_step.final_loss"]["ratio"] == 1.0
    assert (rows["drafter.muon.step_s"]["old"], rows["drafter.muon.step_s"]["new"]) == (0.4, None)
    assert (rows["moe_target.step_ms"]["old"], rows["moe_target.step_ms"]["new"]) == (200.0, 150.0)
    assert rows["moe_target.step_ms"]["ratio"] == pytest.approx(0.75)
    assert rows["moe_target.peak_mem_gib"]["ratio"] is None  # not in the results
    assert rows["moe_target.graphs"]["ratio"] is None  # not in the results
    # speed_experts.json is missing: its rows are all None.
    assert lines[-1].split() == ["moe_experts.graphs", "-", "-", "-"]
    assert json.loads((tmp_path / "speed_report.json").read_text()) == report


def test_speed_report_sets_ringtrains_experts_against_transformers(tmp_path: Path) -> None:
    """moe_experts compares transformers' experts (old) with ringtrain's (new), GPU output rows
    only; the blocks' rows compare the eager blocks, missing here (old None)."""
    rows = [
        {"moe_compile": "transformers", "out": "device", "step_ms": 160.0},
        {"moe_compile": "transformers", "out": "host", "step_ms": 165.0},
        {"moe_compile": "on", "out": "device", "step_ms": 140.0},
    ]
    (tmp_path / "speed_experts.json").write_text(json.dumps({"results": rows}))
    (tmp_path / "speed_moe.json").write_text(json.dumps({"results": rows}))
    subprocess.run(
        [sys.executable, "-m", "tools.bench.speed_report"], cwd=ROOT,
        env={**_env(), "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    report = json.loads((tmp_path / "speed_report.json").read_text())
    entries = {e["metric"]: e for e in report["comparison"]}
    experts = entries["moe_experts.step_ms"]
    assert (experts["old"], experts["new"]) == (160.0, 140.0)
    assert experts["ratio"] == pytest.approx(140.0 / 160.0)
    assert (entries["moe_target.step_ms"]["old"], entries["moe_target.step_ms"]["new"]) == (
        None,
        140.0,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--layout", "2"], "write targets+drafters"),
     (["--layout", "1+1", "--gpu-map", "0"], "give one GPU per rank (2 ranks, targets first)")],
)  # fmt: skip
def test_bench_pipeline_refuses_a_layout_it_cannot_run(flags: list[str], message: str) -> None:
    """The layout arithmetic is the library's (test_monitor_advice); the bench refuses a
    layout with the library's words before it starts any work."""
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_pipeline", *flags],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]


def test_bench_regenerate_against_the_chat_server() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_regenerate", "--records", "40",
         "--concurrency", "4"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["records"] == 40
    assert report["requests"] == 40 and report["regenerate_client_rps"] > 0


# The CUDA benchmarks and a small run of each.
CUDA_BENCHMARKS = {
    "bench_ipc_copy": ["--item-mb", "1"],
    "bench_gemm": ["--sets", "target"],
    "bench_flex": ["--options", "default"],
    "bench_moe_combine": ["--tokens", "64"],
    "bench_row_topk": ["--reps", "1"],
    "fla_configs": ["--shape", "qwen3.5-hybrid"],
}


def test_cuda_benchmarks_refuse_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the gpu-marked runs below run it")
    commands = {m: ["-m", f"tools.bench.{m}", *flags] for m, flags in CUDA_BENCHMARKS.items()}
    for module, proc in run_at_once(commands, ROOT, _env(), 120).items():
        assert proc.returncode != 0, module
        assert f"{module} needs a CUDA GPU" in proc.stderr, (module, proc.stderr[-2000:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_ceiling_benchmarks_on_a_gpu() -> None:
    gemm = _run(["-m", "tools.bench.bench_gemm", "--sets", "target", "--reps", "2", "--json"], ROOT)
    (target,) = gemm["results"]
    assert len(target["shapes"]) == 7 and 0 < target["gemm_fraction_of_peak"] < 1.2
    flex = _run(
        ["-m", "tools.bench.bench_flex", "--options", "default", "--reps", "2", "--json"], ROOT
    )
    assert [r["options"] for r in flex["results"]] == ["dense_causal_sdpa", "default"]
    assert all(r["fwd_bwd_ms"] > 0 for r in flex["results"])
    combine = _run(["-m", "tools.bench.bench_moe_combine", "--tokens", "512", "--json"], ROOT)
    kernel = [r for r in combine["results"] if r["formulation"] == "ringtrain_kernel"]
    assert len(kernel) == 3 and all(r["max_abs_diff"] < 0.1 for r in kernel)
    topk = _run(["-m", "tools.bench.bench_row_topk", "--reps", "2", "--json"], ROOT)
    assert len(topk["results"]) == 64 and sum(r["shipped"] for r in topk["results"]) == 4
    for shape in {(r["rows"], r["width"]) for r in topk["results"]}:
        # Every launch choice ranks equal entries alike (the lower column first).
        same = {r["matches_topk"] for r in topk["results"] if (r["rows"], r["width"]) == shape}
        assert len(same) == 1, shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_ipc_copy_on_a_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_ipc_copy", "--slots", "2", "--item-mb", "8",
         "--reps", "4"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ipc_same_us"] > 0 and report["local_in_turn_us"] > 0


RECIPES = (
    "toy_recipe", "toy_sweep", "chaos_run", "make_toy_target", "regenerate", "real_recipe",
    "real_variants",
)  # fmt: skip


def test_recipe_scripts_parse_their_arguments() -> None:
    commands = {name: ["-m", f"tools.recipes.{name}", "--help"] for name in RECIPES}
    for name, proc in run_at_once(commands, ROOT, _env(), 120).items():
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        assert proc.stdout.startswith("usage:"), (name, proc.stdout[:200])


@pytest.mark.scripts
def test_chaos_regen_round_refuses_a_second_client_and_resumes_the_killed_one(
    tmp_path: Path,
) -> None:
    command = ["-m", "tools.recipes.chaos_run", "--rounds", "1", "--faults", "regen"]
    summary = _run([*command, "--work-dir", str(tmp_path)], ROOT)
    assert (summary["chaos_rounds"], summary["chaos_violations"]) == (1, 0), summary
    assert list(summary["faults"]) == ["regen"]


@pytest.mark.scripts
def test_bench_ring_moves_every_item_intact() -> None:
    report = _run(
        ["-m", "tools.bench.bench_ring", "--item-mb", "0.25", "--items", "40", "--slots", "2",
         "--control-items", "50"],
        cwd=ROOT,
    )  # fmt: skip
    assert (report["produced"], report["consumed"]) == (40, 40)
    assert report["lost"] == report["duplicated"] == report["corrupted"] == 0
    assert report["gbps"] > 0 and report["control_p50_us"] > 0


@pytest.mark.scripts
def test_bench_drafter_small_on_cpu() -> None:
    report = _run(
        ["-m", "tools.bench.bench_drafter", "--device", "cpu", "--small", "--steps", "1",
         "--warmup", "1", "--json"],
        cwd=ROOT,
    )  # fmt: skip
    (result,) = report["results"]
    assert result["recompiles"] == 0 and result["tokens_per_s"] > 0
    assert torch.isfinite(torch.tensor(result["final_loss"]))


def test_bench_drafter_packs_the_recipe_shape_from_documents_as_long_as_its_data() -> None:
    """The recipe's measured batches: many documents of at most its data.max_len (1,024)
    filling 97-100% of the batch; other shapes (and --longest-doc 0): 1-6 documents."""
    from tools.bench.bench_drafter import parse_args
    from tools.bench.drafter_batches import PACKED, doc_lengths

    rng = torch.Generator().manual_seed(0)
    for argv in ([], ["--target-shape", "smollm2-135m", "--longest-doc", "0"]):
        args = parse_args(argv)
        for _ in range(10):
            assert 1 <= len(doc_lengths(rng, args.max_tokens, [], PACKED, args.longest)) <= 6
    args = parse_args(["--target-shape", "smollm2-135m"])
    for _ in range(10):
        lengths = doc_lengths(rng, args.max_tokens, [], PACKED, args.longest)
        assert all(2 <= n <= 1024 for n in lengths) and len(lengths) >= 16
        assert PACKED[0] * args.max_tokens - 1 <= sum(lengths) <= args.max_tokens


@pytest.mark.scripts
def test_bench_target_small_on_cpu() -> None:
    report = _run(
        ["-m", "tools.bench.bench_target", "--device", "cpu", "--small", "--shape", "qwen3-8b",
         "--tokens", "256", "--seq-len", "128", "--iters", "1", "--json"],
        cwd=ROOT,
    )  # fmt: skip
    assert report["results"] and all(r["tokens_per_s"] > 0 for r in report["results"])


@pytest.mark.scripts
def test_bench_load_small_on_cpu(tmp_path: Path) -> None:
    report = _run(
        ["-m", "tools.bench.bench_load", "--device", "cpu", "--small",
         "--dir", str(tmp_path / "load"), "--json"],
        cwd=ROOT,
    )  # fmt: skip
    assert report["loaded_equals_kept"] and report["only_kept_read"]
    assert not (tmp_path / "load").exists()


@pytest.mark.scripts
def test_bench_target_tp_tiny_group_on_cpu(tmp_path: Path) -> None:
    report = _run(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "tools.bench.bench_target_tp", "--shape", "tiny", "--device", "cpu",
         "--tokens", "256", "--seq-len", "128", "--iters", "1", "--json"],
        cwd=ROOT,
    )  # fmt: skip
    assert report["target_tp2_tokens_per_s"] > 0


@pytest.mark.scripts
def test_bench_generate_on_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_generate", "--device", "cpu",
         "--dtype", "float32", "--prompts", "4", "--prompt-lengths", "4:8",
         "--max-new-tokens", "4", "--variants", "dynamic:4,own:4"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in proc.stdout.splitlines()[:2]]
    assert [(r["variant"], r["prompts"], r["new_tokens"]) for r in rows] == [
        ("dynamic:4", 4, 16),
        ("own:4", 4, 16),
    ]
    assert rows[1]["agree"] == 1.0  # float32: the own cache answers as transformers' does


@pytest.mark.scripts
def test_bench_verify_on_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_verify", "--device", "cpu",
         "--dtype", "float32", "--prompt-length", "8", "--blocks", "3", "--block-size", "4",
         "--greedy-tokens", "2"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in proc.stdout.splitlines()[:2]]
    assert [r["mode"] for r in rows] == ["own", "cache"]
    assert rows[1]["agree"] == 1.0  # float32: both caches verify the same choices


@pytest.mark.scripts
def test_bench_pipeline_tiny_on_cpu() -> None:
    report = _run(
        ["-m", "tools.bench.bench_pipeline", "--device", "cpu", "--shapes", "tiny",
         "--cold-shapes", "none", "--skip-standalone", "--steps", "6", "--budget", "512",
         "--mean-len", "128", "--json"],
        cwd=ROOT,
    )  # fmt: skip
    run = report["shapes"]["tiny"]["cold"]
    assert "error" not in run, run
    assert run["steps"] == 6 and run["tokens_per_s"] > 0
    assert 0 < run["first_log_s"] < run["first_step_s"]


def test_first_log_time_reads_the_earliest_rank_log_line(tmp_path: Path) -> None:
    """bench_pipeline's launch-to-first-log-line figure reads the rank logs as
    ringtrain.trainer.logs writes them: the earliest first line of any rank (the target
    logs first here, the drafter after it and then again); a rank log still empty is
    left out."""
    logger = logging.getLogger(LOGGER_NAME)
    written = []
    try:
        for rank, role in ((0, "target"), (1, "drafter")):
            setup_logging(tmp_path, rank, role, terminal_progress=False)
            written.append(time.time())
            logger.info("%s up", role)
            # The next line's stamp must differ (they have millisecond resolution).
            while time.time() < written[-1] + 0.005:
                pass
        logger.info("a later line")
        rank_log_path(tmp_path, 2, "drafter").write_text("")
    finally:
        logger.handlers.clear()
    first = first_log_time(tmp_path)
    assert first is not None
    assert written[0] - 0.001 <= first < written[1] - 0.002
    assert first_log_time(tmp_path / "nothing-logged") is None


def test_bench_pipeline_records_a_run_cut_by_its_timeout_with_its_start_up_log() -> None:
    report = _run(
        ["-m", "tools.bench.bench_pipeline", "--device", "cpu", "--shapes", "tiny",
         "--cold-shapes", "none", "--skip-standalone", "--steps", "6", "--budget", "512",
         "--mean-len", "128", "--run-timeout", "2"],
        cwd=ROOT,
    )  # fmt: skip
    run = report["shapes"]["tiny"]["cold"]
    assert run["error"] == "ran past --run-timeout 2 s"
    assert isinstance(run["startup_log"], dict)
    # Stopped through torchrun: none of its ranks outlives the benchmark.
    ranks = [
        path for path in Path("/proc").glob("[0-9]*/cmdline")
        if b"ringtrain.main" in _read(path) and b"bench-tiny" in _read(path)
    ]  # fmt: skip
    assert not ranks


def _read(path: Path) -> bytes:
    """A file's bytes, or none where it vanished (a process that ended)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.scripts
def test_real_variants_train_and_evaluate_on_cpu(tmp_path: Path) -> None:
    """The paper's recipe, `best` (all four changes at once) and `code_only` (best on the
    code prompts' rows only) of the [variants.cpu] settings train at once (--parallel 3)
    on the real model's data with their overrides and are evaluated losslessly; the
    report is complete and the table names each variant."""
    paths = {"target.path": "model", "data.path": "train", "data.eval_path": "eval",
             "run.run_dir": "runs/smollm2"}  # fmt: skip
    sets = [f"{key}={json.dumps(str(tmp_path / value))}" for key, value in paths.items()]
    proc = subprocess.run(
        [sys.executable, "-m", "tools.recipes.real_variants", "--device", "cpu",
         "--only", "decayed_ce", "best", "code_only", "--parallel", "3",
         *[arg for assignment in sets for arg in ("--set", assignment)]],
        cwd=ROOT, env={**_env(), "OUT": str(tmp_path / "out")}, capture_output=True,
        text=True, timeout=8 * RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "real_variants.json").read_text())
    assert list(report["variants"]) == ["decayed_ce", "best", "code_only"]
    for name, entry in report["variants"].items():
        assert entry["eval"]["lossless"] and entry["eval"]["exit"] == 0, name
        assert entry["eval"]["tau_real"] >= 1.0 and entry["held_out"]["tau_sim"] >= 1.0, name
        assert entry["train_tokens_per_s"] > 0, name
        assert f"- tau_real_humaneval_{name}: " in proc.stdout
    assert report["variants"]["best"]["trained_with"] == ["decayed_ce", "code_only"]
    assert "train_decayed_ce+best+code_only" in report["timings_s"]
    # code_only trained on the regenerated set's code rows: every one of them, nothing else.
    assert report["variants"]["code_only"]["train_sources"] == ["code"]
    everything = source_counts(tmp_path / "train")
    assert set(everything) == {"code", "synthesized", "synthesized_two_turn"}, everything
    assert source_counts(tmp_path / "train-code_only") == {"code": everything["code"]}
    trained = {
        name: json.loads(
            (tmp_path / "runs" / "smollm2-variants" / name / "config.json").read_text()
        )
        for name in report["variants"]
    }
    chosen = {
        name: (c["drafter"]["architecture"], c["drafter"]["objective"], c["optim"]["name"],
               c["optim"]["schedule"], c["run"]["max_steps"])
        for name, c in trained.items()
    }  # fmt: skip
    steps = report["settings"]["steps"]
    assert chosen == {
        "decayed_ce": ("dflash", "decayed_ce", "adamw", "cosine", steps),
        "best": ("dflash2", "dpace", "muon", "wsd", steps),
        "code_only": ("dflash2", "dpace", "muon", "wsd", steps),
    }


def test_split_advice_is_the_lead_drafters_role_split_report(tmp_path: Path) -> None:
    """bench_pipeline records the role-split advice the lead drafter logs at the end of a
    run (ringtrain.monitor.advice), as written through the run's logger: from its first
    line to the conclusion, without the lines' stamps; none where no drafter gave it."""
    logger = logging.getLogger(LOGGER_NAME)
    advice = advise(MeasuredRates(1, 1, 20_000.0, 9_000.0, gpus=1, measured=9_000.0))
    try:
        setup_logging(tmp_path, 1, "drafter", terminal_progress=False)
        logger.info("done: 5 steps")
        for line in advice:
            logger.info("%s", line)
        logger.info("rank1-drafter0 exiting with code 0")
    finally:
        logger.handlers.clear()
    assert advice[-1].lstrip().startswith("=>")
    assert split_advice(tmp_path) == advice
    assert split_advice(tmp_path / "nothing-logged") == []
