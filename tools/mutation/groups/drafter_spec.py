"""The mutants of the drafter's shape and its limits (ringtrain/drafter/spec.py, ringtrain/drafter/limits.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

SPEC_TESTS = (
    "tests/test_drafter_spec.py", "tests/test_drafter_checkpoint.py",
    "tests/test_drafter_config_json.py",
)  # fmt: skip
LIMITS_TESTS = ("tests/test_drafter_spec.py", "tests/test_startup_refusals.py")

GROUPS = (
    Group("drafter spec", "ringtrain/drafter/spec.py", SPEC_TESTS, (
        Mutant("query heads that are no multiple of the key/value heads accepted",
               "        if self.num_attention_heads % self.num_key_value_heads:\n",
               "        if False:\n"),
        Mutant("a block of one token accepted", "if self.block_size < 2:",
               "if self.block_size < 1:"),
        Mutant("a mask token one past the vocabulary accepted",
               "if not 0 <= self.mask_token_id < self.vocab_size:",
               "if not 0 <= self.mask_token_id <= self.vocab_size:"),
        Mutant("a negative mask token accepted",
               "if not 0 <= self.mask_token_id < self.vocab_size:",
               "if not self.mask_token_id < self.vocab_size:"),
        Mutant("a tapped layer one past the target's last accepted",
               "if not 0 <= layer < self.num_target_layers:",
               "if not 0 <= layer <= self.num_target_layers:"),
        Mutant("a negative tapped layer accepted",
               "if not 0 <= layer < self.num_target_layers:",
               "if not layer < self.num_target_layers:"),
        Mutant("more sliding windows than layers accepted",
               "if len(self.sliding_windows) != self.num_layers:",
               "if len(self.sliding_windows) < self.num_layers:"),
        Mutant("a window of exactly block_size refused",
               "if any(w < self.block_size for w in windows):",
               "if any(w <= self.block_size for w in windows):"),
        Mutant("two different sliding windows accepted", "if len(windows) > 1:",
               "if len(windows) > 2:"),
        Mutant("a transformers config object read as a dict",
               'config = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)',
               "config = dict(target_config)"),
        Mutant("rope_parameters.rope_theta ignored",
               '    if isinstance(params, Mapping) and "rope_theta" in params:\n',
               "    if False:\n"),
        Mutant("a RoPE base per layer type read as none (10000)",
               'if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):',
               "if False:"),
        Mutant("the RoPE base without a rope_theta taken as 1e6",
               'return float(config.get("rope_theta", 10000.0))',
               'return float(config.get("rope_theta", 1000000.0))'),
    )),
    Group("drafter limits", "ringtrain/drafter/limits.py", LIMITS_TESTS, (
        Mutant("the optimiser moments left out of the training memory",
               "TRAINING_BYTES_PER_PARAMETER = 16", "TRAINING_BYTES_PER_PARAMETER = 8"),
        Mutant("the smallest tensor named as the largest",
               "name, largest = max(parameters.items(), key=lambda item: item[1].numel())",
               "name, largest = min(parameters.items(), key=lambda item: item[1].numel())"),
        Mutant("the host's available memory taken as its total",
               'if line.startswith("MemTotal:"):', 'if line.startswith("MemAvailable:"):'),
        Mutant("Muon's 0.2 left out of its step scale",
               "scale = MUON_RMS_FACTOR * math.sqrt(widest)", "scale = math.sqrt(widest)"),
        Mutant("a matrix's rows taken as its widest dimension",
               "widest = max((max(p.shape) for p in parameters.values() if p.ndim >= 2), default=1)",
               "widest = max((p.shape[0] for p in parameters.values() if p.ndim >= 2), default=1)"),
        Mutant("the anchor counted among a block's scored slots",
               "check_architecture(drafter, max_anchors * (spec.block_size - 1))",
               "check_architecture(drafter, max_anchors * spec.block_size)"),
    )),
)  # fmt: skip
