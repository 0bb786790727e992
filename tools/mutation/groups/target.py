"""The mutants of the target side: which layers are tapped (the default spread, the checks
of listed ones, the final norm's tap), where each tap lands in the packed features, and
the truncation after the deepest tap, and the conversion of GGUF files (ringtrain/target/)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

TAP_TESTS = ("tests/test_target.py",)
TAPPED_TESTS = ("tests/test_target.py", "tests/test_target_families.py")
GGUF_TESTS = ("tests/test_gguf_convert.py", "tests/test_gguf_hostile.py")

GROUPS = (
    Group("target taps", "ringtrain/target/taps.py", TAP_TESTS, (
        Mutant("the spread up to layer L-2",
               "layers = [round(1 + i * (num_layers - 4) / (k - 1)) for i in range(k)]",
               "layers = [round(1 + i * (num_layers - 3) / (k - 1)) for i in range(k)]"),
        Mutant("one tap of layer 0", "        return [1]\n", "        return [0]\n"),
        Mutant("a target of 4 layers refused", "if num_layers < 4:", "if num_layers <= 4:"),
        Mutant("a spread repeating a layer accepted", "if len(set(layers)) != k:",
               "if len(layers) != k:"),
        Mutant("a negative tapped layer accepted", "if not 0 <= index < num_layers:",
               "if not index < num_layers:"),
        Mutant("the layer past the last accepted", "if not 0 <= index < num_layers:",
               "if not 0 <= index <= num_layers:"),
        Mutant("a listed layer repeated accepted", "if len(set(layers)) != len(layers):",
               "if len(layers) != len(layers):"),
        Mutant("the listed layers sorted",
               "list each layer once\")\n    return layers",
               "list each layer once\")\n    return sorted(layers)"),
        Mutant("the final norm for a tap of the layer before the last",
               "return num_layers - 1 in tap_layers", "return num_layers - 2 in tap_layers"),
    )),
    Group("tapped target", "ringtrain/target/tapped.py", TAPPED_TESTS, (
        Mutant("each tap the output of the layer before (hidden_states[i])",
               "tapped = module.norm if last else module.layers[layer]",
               "tapped = module.norm if last else module.layers[layer - 1]"),
        Mutant("the last layer's tap taken before the final norm",
               "tapped = module.norm if last else module.layers[layer]",
               "tapped = module.layers[layer]"),
        Mutant("the taps' columns in layer order, not the listed order",
               "for k, layer in enumerate(self.tap_layers):",
               "for k, layer in enumerate(sorted(self.tap_layers)):"),
        Mutant("the layer count of the truncated model",
               "self.num_layers = int(config.num_hidden_layers)",
               "self.num_layers = len(module.layers)"),
        Mutant("the first rows written, padding among them",
               "torch.index_select(flat, 0, self._token_index, out=dest)",
               "dest.copy_(flat[: dest.shape[0]])"),
        Mutant("a tap of another dtype not cast", "if dest.dtype == flat.dtype:", "if True:"),
        Mutant("one tap fewer in the width", "return len(self.tap_layers) * self.hidden_size",
               "return (len(self.tap_layers) - 1) * self.hidden_size"),
    )),
    Group("GGUF conversion", "ringtrain/target/gguf.py", GGUF_TESTS, (
        Mutant("a directory holding files written into",
               "if output.exists() and (not output.is_dir() or any(output.iterdir())):",
               "if output.exists() and not output.is_dir():"),
        Mutant("a file without GGUF's magic read", "if magic != GGUF_MAGIC:", "if False:"),
        Mutant("a tied weight stored twice", "            del state[target]\n", "            pass\n"),
        Mutant("the weights readable by the owner only",
               '        shutil.copymode(partial / "config.json", partial / "model.safetensors")\n', ""),
        Mutant("weights the file lacks accepted", '"lacks {}": sorted(loading["missing_keys"]),',
               '"lacks {}": [],'),
        Mutant("weights of the wrong shape accepted",
               '"has {} of the wrong shape": sorted(str(key[0]) for key in loading["mismatched_keys"]),',
               '"has {} of the wrong shape": [],'),
        Mutant("the end of a turn does not stop generation",
               'for key in ("eos_token_id", "eot_token_id")', 'for key in ("eos_token_id",)'),
        Mutant("a failed conversion leaves its partial directory",
               "    except BaseException:\n        shutil.rmtree(partial, ignore_errors=True)\n        raise\n",
               "    except BaseException:\n        raise\n"),
        Mutant("the file parsed again for each load",
               "if not args and not kwargs and Path(path).resolve() == parsed:", "if False:"),
        Mutant("the named weights' remainder counted from one",
               'more = f" and {len(keys) - NAMED_WEIGHTS} more"', 'more = f" and {len(keys) - 1} more"'),
    )),
    Group("target truncation", "ringtrain/target/loader.py", TAPPED_TESTS, (
        Mutant("the deepest tapped layer dropped", "kept = max(taps) + 1", "kept = max(taps)"),
        Mutant("truncated after the last listed tap, not the deepest", "kept = max(taps) + 1",
               "kept = taps[-1] + 1"),
        Mutant("one layer more read", "return layer < kept", "return layer <= kept"),
        Mutant("the final norm read for any tap",
               "or (final_norm and key.startswith(\"norm.\"))", "or key.startswith(\"norm.\")"),
        Mutant("the final norm for the deepest kept layer",
               "final_norm = taps_final_norm(taps, checkpoint.num_layers)",
               "final_norm = taps_final_norm(taps, kept)"),
    )),
)  # fmt: skip
