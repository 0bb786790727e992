"""How much a local model generates at once by default, per device: importable without
torch, so command-line help can show the values.

On a GPU: large batches and answers as long as a served model usually allows. On a CPU,
where a 135M model makes a few dozen tokens a second, answers that finish within
minutes, and for ``regenerate --local`` a few answers at once (continuous batching keeps
them busy, and a CPU step costs in proportion to its rows, so more rows only delay every
record). Fewer answers run at once when memory is short (``ringtrain.generate.memory``),
and answers never take more than half the model's context by default.
"""

GPU_BATCH_SIZE = 2048
CPU_BATCH_SIZE = 64
REGENERATE_CPU_BATCH_SIZE = 16
GPU_MAX_TOKENS = 4096
CPU_MAX_TOKENS = 512
# The share of the memory available when generation starts that it plans to use: the
# rest absorbs what the estimate leaves out (allocator slack, temporaries, other
# processes growing meanwhile).
BUDGET_FRACTION = 0.8
