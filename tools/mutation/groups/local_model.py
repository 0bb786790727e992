"""The mutants of a local model for generation: its loading, device, dtype, threads, context and token defaults (ringtrain/generate/local_model.py), and whether a directory holds a tokenizer (generate/tokenizer_files.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

TESTS = (
    "tests/test_local_model.py", "tests/test_regen_local_settings.py", "tests/test_generate_rounds.py",
)  # fmt: skip

GROUPS = (
    Group("local model", "ringtrain/generate/local_model.py", TESTS, (
        Mutant("the load average not subtracted from the cores",
               "return max(1, cores - int(os.getloadavg()[0]))", "return max(1, cores)"),
        Mutant("zero threads on a machine busier than its cores",
               "return max(1, cores - int(os.getloadavg()[0]))",
               "return max(0, cores - int(os.getloadavg()[0]))"),
        Mutant("the machine's cores counted instead of those this process may use",
               "cores = len(os.sched_getaffinity(0))", "cores = os.cpu_count() or 1"),
        Mutant("the context of a multimodal model read from its outer config",
               'text = config.get_text_config() if hasattr(config, "get_text_config") else config',
               "text = config"),
        Mutant("the GPU's and the CPU's answer lengths swapped",
               'tokens = GPU_MAX_TOKENS if device.type == "cuda" else CPU_MAX_TOKENS',
               'tokens = CPU_MAX_TOKENS if device.type == "cuda" else GPU_MAX_TOKENS'),
        Mutant("answers as long as the whole context by default",
               "min(tokens, context // 2)", "min(tokens, context)"),
        Mutant("the device's default not a cap on half the context",
               "max(1, min(tokens, context // 2))", "max(1, context // 2)"),
        Mutant("a model without tokenizer files handed to AutoTokenizer",
               "    if not has_tokenizer_files(model_dir):\n        return None", "    if False:\n        return None"),
        Mutant("auto never picks the GPU",
               'return torch.device("cuda" if torch.cuda.is_available() else "cpu")',
               'return torch.device("cpu")'),
        Mutant("cuda taken where there is no GPU",
               'if name == "cuda" and not torch.cuda.is_available():', "if False:"),
        Mutant("the batch size given ignored",
               "batch_size or default_batch_size(where),", "default_batch_size(where),"),
        Mutant("the dtype given ignored",
               "model = load_causal_lm(model_dir, where, dtype)",
               "model = load_causal_lm(model_dir, where)"),
        Mutant("a pad id of 0 ignored", "if pad is not None:", "if pad:"),
    )),
    Group("tokenizer files", "ringtrain/generate/tokenizer_files.py", TESTS, (
        Mutant("a model with only one of the tokenizer files read as without a tokenizer",
               "return any((Path(model_dir) / name).is_file()",
               "return all((Path(model_dir) / name).is_file()"),
    )),
)  # fmt: skip
