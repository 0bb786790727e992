"""The mutants of the config files either side of a run: the drafter's config.json, built
from the target's config, written for the serving engines and read back
(ringtrain/drafter/hf_config.py), and the target's model directory, its config.json and
the index of its weights (ringtrain/target/model_dir.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

DRAFTER_CONFIG_TESTS = (
    "tests/test_drafter_config_json.py", "tests/test_drafter_checkpoint.py",
    "tests/test_drafter_sliding.py", "tests/test_drafter_dflash2.py",
)  # fmt: skip
MODEL_DIR_TESTS = (
    "tests/test_model_dir.py", "tests/test_target.py", "tests/test_target_quantized.py",
)  # fmt: skip

GROUPS = (
    Group("drafter config.json", "ringtrain/drafter/hf_config.py", DRAFTER_CONFIG_TESTS, (
        Mutant("the drafter's own head count ignored",
               'heads = cfg.num_attention_heads or int(tc["num_attention_heads"])',
               'heads = int(tc["num_attention_heads"])'),
        Mutant("the target's key/value heads taken as its query heads",
               'or int(tc.get("num_key_value_heads") or tc["num_attention_heads"])',
               'or int(tc["num_attention_heads"])'),
        Mutant("a mask token id of 0 taken as unset",
               "mask_token_id=cfg.mask_token_id if cfg.mask_token_id >= 0 else vocab_size - 1",
               "mask_token_id=cfg.mask_token_id if cfg.mask_token_id > 0 else vocab_size - 1"),
        Mutant("causal sliding attention kept without a sliding layer",
               'sliding_causal=cfg.sliding_attention == "causal" and any(cfg.sliding_windows),',
               'sliding_causal=cfg.sliding_attention == "causal",'),
        Mutant("a target without intermediate_size accepted",
               "    if spec.intermediate_size <= 0:\n", "    if False:\n"),
        Mutant("bidirectional training writes no causality",
               '        return {"is_causal": False}', "        return {}"),
        Mutant("causal sliding layers beside full-attention ones make every layer causal",
               "    if all(spec.sliding_windows):", "    if any(spec.sliding_windows):"),
        Mutant("the tapped layers written sorted", '"target_layer_ids": list(spec.tap_layers),',
               '"target_layer_ids": sorted(spec.tap_layers),'),
        Mutant("vLLM's dflash_config.causal not written",
               '            **({"causal": causal["is_causal"]} if causal else {}),\n', ""),
        Mutant("the architecture's settings not written",
               "            **msgspec.structs.asdict(spec.settings),\n", ""),
        Mutant("a config.json naming no known architecture read as DFlash2",
               'name = declared[0] if declared else "dflash"',
               'name = declared[0] if declared else "dflash2"'),
        Mutant("the engines' required dflash_config keys not named", "    if missing:\n",
               "    if False:\n"),
        Mutant("dflash_config.causal read over is_causal",
               "    if declared is None:\n        declared = (config", "    if True:\n        declared = (config"),
        Mutant("sliding layers bidirectional when nothing is declared",
               '    return [kind == "sliding_attention" for kind in layer_types]',
               "    return [False] * len(layer_types)"),
        Mutant("causal full-attention layers accepted",
               'if any(c and kind != "sliding_attention" for c, kind in zip(causal, layer_types, strict=True)):',
               "if False:"),
        Mutant("a block size written at the top level only ignored",
               'block_size=int(dflash.get("block_size", config.get("block_size", 16))),',
               'block_size=int(dflash.get("block_size", 16)),'),
        Mutant("a config.json without layer_types refused",
               'layer_types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]',
               'layer_types = config["layer_types"]'),
    )),
    Group("target model directory", "ringtrain/target/model_dir.py", MODEL_DIR_TESTS, (
        Mutant("a target path under ~ not expanded", "self.path = Path(path).expanduser()",
               "self.path = Path(path)"),
        Mutant("a missing directory said as one without config.json",
               "        if not self.path.is_dir():\n", "        if False:\n"),
        Mutant("a directory without config.json not named",
               "        if not config_file.is_file():\n", "        if False:\n"),
        Mutant("a torn config.json not named", "        except json.JSONDecodeError as exc:\n",
               "        except KeyError as exc:\n"),
        Mutant("a wrapper's config read as the text model's",
               'self.text_config_dict: dict = full.get("text_config") or full',
               "self.text_config_dict: dict = full"),
        Mutant("a wrapper's quantization not applied to its language model",
               '        ) or full.get("quantization_config")\n', "        )\n"),
        Mutant("a wrapper's text model typed as the wrapper",
               "model_type = f\"{full.get('model_type')}_text\"",
               "model_type = full.get(\"model_type\")"),
        Mutant("a model type unknown to transformers not named",
               "        if model_type not in CONFIG_MAPPING:\n", "        if False:\n"),
        Mutant("an index listing missing shards accepted",
               "        if missing:\n            raise TargetLoadError(",
               "        if False:\n            raise TargetLoadError("),
        Mutant("a LLaVA-style layout's language model not found", '    "language_model.model.",\n',
               ""),
        Mutant("a layer number anywhere in a key taken as a decoder layer's",
               "match = LAYER_KEY.match(relative_key)",
               'match = re.search(r"layers\\.(\\d+)\\.", relative_key)'),
        Mutant("per-layer lists kept whole in a truncated config",
               "            cut[key] = value[:num_layers]", "            cut[key] = value"),
    )),
)  # fmt: skip
