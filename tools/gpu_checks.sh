#!/usr/bin/env bash
# Run the GPU-marked tests and the GPU benchmarks on a CUDA machine, one after another,
# collecting each benchmark's JSON and one combined log (gpu_checks.log) under $OUT
# (default: ./gpu-results). Each step is time-limited; a failure does not stop the others.
# Usage: tools/gpu_checks.sh [tests|quicktests] [ring] [ring_mps] [ipc_copy] [drafter]
#        [target] [pipeline] [pipeline_mps] [target_moe] [load] [pipeline_moe] [moe_report]
#        [speed] [speed_moe] [speed_dflash2] [speed_experts] [ceilings] [hybrid]
#        [speed_small] [hybrid_pipeline] [hybrid_27b_pipeline]
# (default: tests ring drafter target pipeline; run from the project root: the benchmarks
# run as modules, python -m tools.bench.<name>). The Qwen3-30B-A3B (mixture-of-experts)
# checks, about 7 minutes: tools/gpu_checks.sh target_moe load pipeline_moe moe_report
# Two GPUs: [target_tp] (a Qwen3-32B-shaped target on one GPU and as a tensor-parallel
# group of two) [pipeline_tp2] (that group + 2 drafters on both GPUs under MPS)
# [multigpu] (2 targets + 2 drafters under MPS against 1 + 1 on one GPU; multigpu_bf16:
# bf16 gradient reduction; multigpu_fp64: fp64, the repeatable sum) [split] (1 target on GPU 0, 1 drafter on GPU 1).
# One GPU: [longdocs] (1 + 1 on rows of 3k, 8k, 16k and 32k tokens). [hybrid] (about 8
# minutes): FLA's kernel configurations tuned and written for this GPU, the first forward
# without and with them, the hybrid target's compiled MFU. [hybrid_pipeline] (about 9
# minutes): the hybrid target 1 + 1 under MPS, its first step cold and warm, each role's
# busy share. [hybrid_27b_pipeline] (about 9 minutes): the same for the Qwen3.5-27B
# hybrid at full size, once. [speed_small] (about 5 minutes): the real recipe's drafter
# shape on the recipe's documents, DFlash against DFlash2 and the default with their
# kernels and idle gaps, then on batches of a few long documents.
# [speed] (about 4 minutes): the drafter's step paths side by side in one process
# (bench_drafter base against fast_step, cudagraphs and muon); [speed_moe] (about 2
# minutes): the Qwen3-30B-A3B target's mixture-of-experts blocks eager / compiled; each
# ends with a table with ratios (tools/bench/speed_report.py). [speed_dflash2] (about 4
# minutes): the DFlash2 drafter's step against DFlash's (fast_step), both profiled, then
# on the real-model recipe's drafter shape with the defaults' step (default).
# [speed_experts] (about 3 minutes): the Qwen3-30B-A3B target's compiled MoE blocks with
# transformers' grouped_mm experts against ringtrain's (one-kernel top-k combine).
# [ceilings] (about 6 minutes): what the hardware allows: the models' GEMM shapes alone
# (bench_gemm), the drafter's attention under flex_attention kernel options against dense
# causal flash attention (bench_flex), the MoE top-k combine's formulations
# (bench_moe_combine).
set -uo pipefail
export OUT=${OUT:-gpu-results}
# Python keeps the bytecode of what it imports, as pip's install writes it for a user: on
# a machine whose Python is told not to (PYTHONDONTWRITEBYTECODE) and whose packages hold
# none, every process compiled every module's source as it imported it (13-18 s for
# `import ringtrain.main` on an H100 machine against 3 s), and the start-up figures
# counted that as ringtrain's. The first import below writes it once, before any timing.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/ringtrain-pycache}
python -c "import ringtrain.main, transformers.models.auto.modeling_auto"
python -c "import fla.ops" 2>/dev/null || echo "flash-linear-attention is not installed (the hybrid steps need it)"
out=$OUT
mkdir -p "$out"
steps=${*:-tests ring drafter target pipeline}
run() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T))" | tee -a "$out/gpu_checks.log"
    timeout "$limit" "$@" > "$out/step.log" 2>&1
    echo "exit $? after $SECONDS s" | tee -a "$out/step.log"
    cat "$out/step.log" >> "$out/gpu_checks.log"
    tail -n 25 "$out/step.log"
    rm -f "$out/step.log"
}
nvidia-smi -L
for step in $steps; do
    case $step in
        tests) run tests 300 python -m pytest -q -m gpu -p no:cacheprovider tests ;;
        quicktests) run tests 320 python -m pytest -q -m gpu -p no:cacheprovider \
            tests/test_ring_gpu.py tests/test_target_gpu.py tests/test_drafter_gpu.py \
            tests/test_linear_attention.py ;;
        ring | ring_mps)
            # ring_mps: the same under the CUDA MPS daemon (two ranks on one GPU share
            # one hardware context instead of being time-sliced).
            [ "$step" = ring_mps ] && nvidia-cuda-mps-control -d
            for transport in device host; do
                items=6000
                [ $transport = host ] && items=400
                run "${step}_$transport" 120 python -m tools.bench.bench_ring --transport $transport \
                    --producers 1 --consumers 1 --slots 4 --item-mb 256 --items $items --json
                mv "$out/bench_ring.json" "$out/${step}_$transport.json" 2>/dev/null
            done
            [ "$step" = ring_mps ] && echo quit | nvidia-cuda-mps-control ;;
        ipc_copy) run ipc_copy 120 python -m tools.bench.bench_ipc_copy --json ;;
        drafter) run drafter 420 python -m tools.bench.bench_drafter --json --profile ;;
        target) run target 540 python -m tools.bench.bench_target --shape qwen3-8b \
            --shape qwen3.5-hybrid --tokens 9216 --seq-len 3072 --profile --json ;;
        hybrid)
            # FLA's kernels tuned on this GPU for the 27B and the default hybrid shapes
            # (ringtrain/target/fla_configs/<GPU>/, copied to $OUT: commit it), the first
            # forward timed without and with them, then the hybrid shape's compiled MFU.
            for shape in qwen3.5-27b qwen3.5-hybrid; do
                run "fla_configs_$shape" 300 python -m tools.bench.fla_configs --shape $shape
                mv "$out/fla_configs.json" "$out/fla_configs_$shape.json" 2>/dev/null
            done
            cp -r ringtrain/target/fla_configs "$out/" 2>/dev/null
            run target_hybrid 300 python -m tools.bench.bench_target --shape qwen3.5-hybrid \
                --tokens 9216 --seq-len 3072 --compile on --profile --json
            mv "$out/bench_target.json" "$out/target_hybrid.json" 2>/dev/null ;;
        pipeline | pipeline_mps)
            # Qwen3-8B shapes: standalone target and drafter rates, then the shared-GPU
            # trainer cold and warm (pipeline_efficiency, cold/warm start, recompiles).
            [ "$step" = pipeline_mps ] && nvidia-cuda-mps-control -d
            run "$step" 560 python -m tools.bench.bench_pipeline --budget 9216 --steps 30 \
                --shapes qwen3-8b --json
            mv "$out/bench_pipeline.json" "$out/$step.json" 2>/dev/null
            [ "$step" = pipeline_mps ] && echo quit | nvidia-cuda-mps-control ;;
        target_moe)
            run target_moe 200 python -m tools.bench.bench_target --shape qwen3-30b-a3b \
                --tokens 9216 --seq-len 3072 --compile on --profile --json
            mv "$out/bench_target.json" "$out/target_moe.json" 2>/dev/null ;;
        load)
            # A 16 GB checkpoint under /tmp, loaded cold and warm, then deleted.
            run load 200 python -m tools.bench.bench_load --dir "/tmp/ringtrain-bench-load-$$" --json ;;
        pipeline_moe)
            # The standalone target rate comes from target_moe when it ran (same shape,
            # batch and compile setting); the drafter's is measured here.
            reuse=()
            [ -f "$out/target_moe.json" ] && reuse=(--target-result "$out/target_moe.json")
            run pipeline_moe 330 python -m tools.bench.bench_pipeline --budget 9216 --steps 30 \
                --shapes qwen3-30b-a3b --cold-shapes none "${reuse[@]}" --json
            mv "$out/bench_pipeline.json" "$out/pipeline_moe.json" 2>/dev/null ;;
        moe_report) OUT=$out python -m tools.bench.moe_report | tee -a "$out/gpu_checks.log" ;;
        target_tp) run target_tp 420 torchrun --standalone --nproc-per-node 2 \
            -m tools.bench.bench_target_tp --json ;;
        pipeline_tp2)
            run pipeline_tp2 560 python -m tools.bench.bench_pipeline --shapes qwen3-32b \
                --layout 2+2 --gpu-map 0,1,0,1 --mps --target-tp 2 --budget 9216 --steps 30 \
                --cold-shapes none --json
            mv "$out/bench_pipeline.json" "$out/pipeline_tp2.json" 2>/dev/null ;;
        multigpu | multigpu_bf16 | multigpu_fp64)
            reduce=()
            [ "$step" = multigpu_bf16 ] && reduce=(--set 'optim.grad_reduce_dtype="bfloat16"')
            [ "$step" = multigpu_fp64 ] && reduce=(--set 'optim.grad_reduce_dtype="float64"')
            run "$step" 560 python -m tools.bench.bench_pipeline --shapes qwen3-8b --layout 2+2 \
                --gpu-map 0,1,0,1 --mps --scale-reference --budget 9216 --steps 30 \
                --cold-shapes none --skip-standalone "${reduce[@]}" --json
            mv "$out/bench_pipeline.json" "$out/$step.json" 2>/dev/null ;;
        split)
            run split 400 python -m tools.bench.bench_pipeline --shapes qwen3-8b --layout 1+1 \
                --gpu-map 0,1 --budget 9216 --steps 30 --cold-shapes none --json
            mv "$out/bench_pipeline.json" "$out/split.json" 2>/dev/null ;;
        longdocs)
            for len in 3072 8192 16384 32768; do
                run "longdocs_$len" 200 python -m tools.bench.bench_pipeline --shapes qwen3-8b \
                    --budget $((len > 9216 ? len : 9216)) --mean-len $len --steps 20 \
                    --cold-shapes none --skip-standalone --json
                mv "$out/bench_pipeline.json" "$out/longdocs_$len.json" 2>/dev/null
            done ;;
        speed)
            run speed_drafter 300 python -m tools.bench.bench_drafter \
                --variants base,fast_step,cudagraphs,muon --steps 10 --json
            mv "$out/bench_drafter.json" "$out/speed_drafter.json" 2>/dev/null
            OUT=$out python -m tools.bench.speed_report | tee -a "$out/gpu_checks.log" ;;
        speed_dflash2)
            run speed_dflash2 300 python -m tools.bench.bench_drafter \
                --variants fast_step,dflash2 --steps 10 --profile --json
            mv "$out/bench_drafter.json" "$out/speed_dflash2.json" 2>/dev/null
            run speed_dflash2_smollm2 200 python -m tools.bench.bench_drafter \
                --target-shape smollm2-135m --variants fast_step,dflash2,default --steps 10 --json
            mv "$out/bench_drafter.json" "$out/speed_dflash2_smollm2.json" 2>/dev/null ;;
        speed_small)
            # The real recipe's drafter shape on the recipe's documents: DFlash (fast_step)
            # against DFlash2 and the default, with the kernels and the GPU's idle gaps of
            # each (dflash2_speed_ratio_small, default_speed_ratio_small, drafter_mfu_small),
            # then the same on the earlier batches of 1-6 long documents (--longest-doc 0).
            run speed_small 300 python -m tools.bench.bench_drafter --target-shape smollm2-135m \
                --variants fast_step,dflash2,default_chunk16k --steps 10 --profile --profile-top 500 \
                --gaps --json
            mv "$out/bench_drafter.json" "$out/speed_small.json" 2>/dev/null
            run speed_small_long_docs 200 python -m tools.bench.bench_drafter \
                --target-shape smollm2-135m --longest-doc 0 \
                --variants fast_step,dflash2,default_chunk16k --steps 10 --json
            mv "$out/bench_drafter.json" "$out/speed_small_long_docs.json" 2>/dev/null ;;
        hybrid_pipeline)
            # The hybrid target, 1 + 1 on one GPU under MPS: the first step from empty
            # caches, then from warm ones, and each role's busy share
            # (cold_first_step_hybrid_s, warm_first_step_hybrid_s, pipeline_min_busy_hybrid).
            run hybrid_pipeline 560 python -m tools.bench.bench_pipeline --skip-standalone \
                --budget 9216 --steps 30 --shapes qwen3.5-hybrid --cold-shapes qwen3.5-hybrid \
                --mps --run-timeout 250 --json
            mv "$out/bench_pipeline.json" "$out/hybrid_pipeline.json" 2>/dev/null ;;
        hybrid_27b_pipeline)
            # The Qwen3.5-27B hybrid target at full size (random weights, about 46 GiB of
            # bf16) 1 + 1 with its drafter on one GPU under MPS, once, from empty caches
            # (pipeline_tokens_per_s_hybrid_27b, each role's busy share).
            run hybrid_27b_pipeline 560 python -m tools.bench.bench_pipeline --skip-standalone \
                --budget 9216 --steps 20 --shapes qwen3.5-27b --cold-shapes none --mps \
                --run-timeout 500 --json
            mv "$out/bench_pipeline.json" "$out/hybrid_27b_pipeline.json" 2>/dev/null ;;
        speed_moe)
            run speed_moe 200 python -m tools.bench.bench_target --shape qwen3-30b-a3b \
                --tokens 9216 --seq-len 3072 --compile on --moe-compile both --json
            mv "$out/bench_target.json" "$out/speed_moe.json" 2>/dev/null
            OUT=$out python -m tools.bench.speed_report | tee -a "$out/gpu_checks.log" ;;
        speed_experts)
            run speed_experts 240 python -m tools.bench.bench_target --shape qwen3-30b-a3b \
                --tokens 9216 --seq-len 3072 --compile on --moe-compile experts --profile --json
            mv "$out/bench_target.json" "$out/speed_experts.json" 2>/dev/null
            OUT=$out python -m tools.bench.speed_report | tee -a "$out/gpu_checks.log" ;;
        ceilings)
            run gemm 120 python -m tools.bench.bench_gemm --json
            run flex 300 python -m tools.bench.bench_flex --json
            run moe_combine 120 python -m tools.bench.bench_moe_combine --json ;;
        *) echo "unknown step $step" ;;
    esac
done
