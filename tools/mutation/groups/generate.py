"""The mutants of local generation (ringtrain/generate/): batched greedy decoding, its own
key/value cache, continuous batching and answering conversations in rounds. Token sampling
is in evaluation.py."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

DECODE_TESTS = (
    "tests/test_regenerate_local.py", "tests/test_generate_rounds.py",
    "tests/test_token_sampling.py", "tests/test_regenerate_local_cpu.py",
)  # fmt: skip
CONTINUOUS_TESTS = ("tests/test_regenerate_local.py", "tests/test_regenerate_local_cpu.py")
ROUNDS_TESTS = ("tests/test_generate_rounds.py",)

GROUPS = (
    Group("greedy batches", "ringtrain/generate/greedy.py", DECODE_TESTS, (
        Mutant("a batch one prompt short of its size", "and rows <= batch_size",
               "and rows < batch_size"),
        Mutant("a batch's rows without their new tokens", "width = lengths[i] + new_tokens",
               "width = lengths[i]"),
        Mutant("one padding token attended", "mask[row, width - len(prompt) :] = 1",
               "mask[row, width - len(prompt) - 1 :] = 1"),
        Mutant("the stop token dropped", "return Answer(list(row[: i + 1]), truncated=False)",
               "return Answer(list(row[:i]), truncated=False)"),
        Mutant("an answer cut at the limit not truncated",
               "return Answer(list(row[:max_new_tokens]), truncated=True)",
               "return Answer(list(row[:max_new_tokens]), truncated=False)"),
        Mutant("answers handed to the prompts in index order",
               "for i, row in zip(rows, new.tolist(), strict=True):",
               "for i, row in zip(sorted(rows), new.tolist(), strict=True):"),
        Mutant("tokens after a stop counted",
               "self.report(int(torch.where(stopped.any(dim=1), first, new.shape[1]).sum()))",
               "self.report(int(new.shape[0] * new.shape[1]))"),
    )),
    Group("batch decode", "ringtrain/generate/batch_decode.py", DECODE_TESTS, (
        Mutant("padding attended by the prompt",
               "return (causal[None] & (valid[:, None, :] | itself[None]))[:, None]",
               "return causal[None, None].expand(valid.shape[0], 1, width, width)"),
        Mutant("padding attended by the decode steps", "keep[:, 0, 0, :width] = valid",
               "keep[:, 0, 0, :width] = True"),
        Mutant("the first step at the prompt's last position", "positions=positions[:, -1:] + 1,",
               "positions=positions[:, -1:],"),
        Mutant("the first step overwrites the prompt's last key", "cache.position.fill_(width)",
               "cache.position.fill_(width - 1)"),
        Mutant("one decode step fewer", "model, cache, state, max_new_tokens - 1, graph",
               "model, cache, state, max_new_tokens - 2, graph"),
        Mutant("the batch ends when any row stops", "if bool(state.done.all()):",
               "if bool(state.done.any()):"),
        Mutant("the decode steps skip each prompt's first token", "keep[:, 0, 0, :width] = valid",
               "keep[:, 0, 0, :width] = valid & (valid.cumsum(-1) > 1)"),
    )),
    Group("continuous batching", "ringtrain/generate/continuous.py", CONTINUOUS_TESTS, (
        Mutant("an answer one token over its limit",
               "if len(slot.tokens) >= slot.request.max_new_tokens:",
               "if len(slot.tokens) > slot.request.max_new_tokens:"),
        Mutant("a stop token does not end the answer", "if slot.tokens[-1] in self.stops:",
               "if False:"),
        Mutant("a step does not see its own position",
               "self.cache.horizon = max(slot.position for slot in active) + 1",
               "self.cache.horizon = max(slot.position for slot in active)"),
        Mutant("a moved slot's keys and values left behind",
               "            self.cache.move(last, index, moving.position)\n", ""),
        Mutant("a moved slot's mask left behind", "            self.keep[index] = self.keep[last]\n",
               ""),
        Mutant("a new slot keeps its last answer's mask", "            self.keep[index] = False\n",
               ""),
        Mutant("a new slot skips its prompt's first key", "self.keep[index, ..., :length] = True",
               "self.keep[index, ..., 1:length] = True"),
        Mutant("a moved slot's last key left behind",
               "self.cache.move(last, index, moving.position)",
               "self.cache.move(last, index, moving.position - 1)"),
        Mutant("a prompt's padding placed in its slot",
               "buffer[slot, :, :length] = theirs[layer][row, :, width - length :]",
               "buffer[slot, :, :length] = theirs[layer][row, :, :length]"),
        Mutant("one slot fewer than the budget holds",
               "return min(slots, 1 + (budget - need) // per_slot), length",
               "return min(slots, (budget - need) // per_slot), length"),
    )),
    Group("answer rounds", "ringtrain/generate/rounds.py", ROUNDS_TESTS, (
        Mutant("the given assistant turns kept",
               "        if message[\"role\"] == \"assistant\":\n            continue\n", ""),
        Mutant("a turn ends at any message", "        if message[\"role\"] == \"user\":\n",
               "        if True:\n"),
        Mutant("a turn's history forgotten", "histories[i] += part", "histories[i] = list(part)"),
        Mutant("the target's answer not in the history",
               "histories[i].append({\"role\": \"assistant\", \"content\": reply})", "pass"),
        Mutant("every conversation drawn",
               "if int((i + 1) * fraction) > int(i * fraction))",
               "if int((i + 1) * fraction) >= int(i * fraction))"),
        Mutant("the drawn rows answered greedily",
               "(sampled.sampler, [row for row, draws in enumerate(drawn) if draws]),",
               "(None, [row for row, draws in enumerate(drawn) if draws]),"),
        Mutant("only the last call's figures", "totals += stats", "totals = stats"),
    )),
)  # fmt: skip
