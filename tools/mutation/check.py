"""Mutation check: does the suite notice a one-line change to what users read?

    python -m tools.mutation.check --clone /tmp/mut            # every mutant
    python -m tools.mutation.check --clone /tmp/mut --only ties --only metrics
    python -m tools.mutation.check --list

It clones the project's committed state into --clone (a directory that must not exist
yet), then for each mutant in MUTANTS changes one line of one module in the clone, runs
that module's tests there (`python -m pytest -x` with the clone first on PYTHONPATH; the
tests marked slow or gpu left out), and puts the line back. A mutant is killed when the
tests fail. The tests of each group are first run on the unchanged clone: a group whose
tests fail already is reported and skipped. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu"]


@dataclass(frozen=True)
class Mutant:
    """One line of `module` changed from `old` to `new` (the text must occur exactly once)."""

    label: str
    old: str
    new: str


@dataclass(frozen=True)
class Group:
    """The mutants of one module and the tests that cover it."""

    name: str
    module: str
    tests: tuple[str, ...]
    mutants: tuple[Mutant, ...]


EVAL_TESTS = (
    "tests/test_eval_metrics.py",
    "tests/test_eval_speculative.py",
    "tests/test_eval_cli.py",
)
OBJECTIVE_TESTS = (
    "tests/test_defaults.py", "tests/test_drafter_loss.py", "tests/test_drafter_objective.py",
)  # fmt: skip
SCHEDULE_TESTS = ("tests/test_optim_choices.py", "tests/test_drafter_checkpoint.py")
CHECKPOINT_TESTS = ("tests/test_checkpoint_verify.py", "tests/test_checkpoint_safety.py")
RETENTION_TESTS = ("tests/test_checkpoint_retention.py", *CHECKPOINT_TESTS)
LIVENESS_TESTS = ("tests/test_liveness_slow.py",)
HELDOUT_TESTS = ("tests/test_drafter_heldout.py", "tests/test_heldout_rounds.py")
SUMS_TESTS = (*HELDOUT_TESTS, "tests/test_drafter_objective.py", "tests/test_drafter_arch.py")
ADVICE_TESTS = ("tests/test_monitor_advice.py", "tests/test_monitor_verdict.py")
RING_FIGURE_TESTS = (*ADVICE_TESTS, "tests/test_monitor_run.py", "tests/test_monitor_stat.py")
CONFIG_TESTS = (
    "tests/test_config.py", "tests/test_preflight.py", "tests/test_startup_refusals.py",
)  # fmt: skip
SELECTOR_TESTS = ("tests/test_drafter_dflash2.py", "tests/test_drafter_arch.py")

MUTANTS = (
    Group("metrics", "ringtrain/eval/metrics.py", EVAL_TESTS, (
        Mutant("tau_real counts one more token per prompt",
               "tau_real=(sum(accepted) + forwards) / forwards",
               "tau_real=(sum(accepted) + forwards + len(outcomes)) / forwards"),
        Mutant("acceptance at k counts forwards past k",
               "sum(count >= k for count in accepted)", "sum(count > k for count in accepted)"),
        Mutant("acceptance starts at position 0",
               "for k in range(1, block_size)]", "for k in range(0, block_size - 1)]"),
        Mutant("speculative tokens/s from the plain tokens",
               "speculative_tokens_per_s = spec_tokens / spec_seconds",
               "speculative_tokens_per_s = plain_tokens / spec_seconds"),
        Mutant("generated tokens one more per prompt",
               "spec_tokens = sum(len(o.speculative.tokens) for o in outcomes)",
               "spec_tokens = sum(len(o.speculative.tokens) + 1 for o in outcomes)"),
        Mutant("speedup inverted",
               "speedup=speculative_tokens_per_s / plain_tokens_per_s",
               "speedup=plain_tokens_per_s / speculative_tokens_per_s"),
        Mutant("a set's report of every outcome",
               "members = [o for o in outcomes if o.benchmark == name]", "members = outcomes"),
        Mutant("a category's report of its whole set",
               "chosen = [o for o in members if o.category == category]", "chosen = members"),
        Mutant("mismatches never counted",
               "if checked and (m := _mismatch(o)) is not None]",
               "if not checked and (m := _mismatch(o)) is not None]"),
    )),
    Group("ties", "ringtrain/eval/ties.py", ("tests/test_eval_ties.py",), (
        Mutant("tolerance 10x looser", "tolerance = self.tie_ulps * ulp(",
               "tolerance = 10 * self.tie_ulps * ulp("),
        Mutant("the boundary margin is no tie",
               "tie = self.allows_ties and (margin <= tolerance or",
               "tie = self.allows_ties and (margin < tolerance or"),
        Mutant("ulp one bit too coarse", "return math.ldexp(1.0, exponent - (bits - 1))",
               "return math.ldexp(1.0, exponent - bits + 2)"),
        Mutant("margin from the higher of the two logits",
               "margin = top - min(float(logits[speculative]), float(logits[greedy]))",
               "margin = top - max(float(logits[speculative]), float(logits[greedy]))"),
        Mutant("fp16 with bf16's precision", "torch.float16: 11}", "torch.float16: 8}"),
        Mutant("ties allowed at tie_ulps 0",
               "return self.dtype in SIGNIFICANT_BITS and self.tie_ulps > 0",
               "return self.dtype in SIGNIFICANT_BITS and self.tie_ulps >= 0"),
    )),
    Group("tie default", "ringtrain/eval/settings.py", ("tests/test_eval_ties.py",), (
        Mutant("default tolerance 40 ulps", "DEFAULT_TIE_ULPS = 4.0", "DEFAULT_TIE_ULPS = 40.0"),
    )),
    Group("defaults", "ringtrain/drafter/config.py", ("tests/test_defaults.py",), (
        Mutant("default objective decayed_ce",
               'objective: Literal["decayed_ce", "dpace"] = "dpace"',
               'objective: Literal["decayed_ce", "dpace"] = "decayed_ce"'),
        Mutant("default architecture dflash",
               'architecture: Literal["dflash", "dflash2"] = "dflash2"',
               'architecture: Literal["dflash", "dflash2"] = "dflash"'),
        Mutant("default optimiser adamw", 'name: Literal["adamw", "muon"] = "muon"',
               'name: Literal["adamw", "muon"] = "adamw"'),
        Mutant("default schedule cosine", 'schedule: Literal["cosine", "wsd"] = "wsd"',
               'schedule: Literal["cosine", "wsd"] = "cosine"'),
        Mutant("default decay fraction 0.1", "msgspec.Meta(ge=0.0, le=1.0)] = 0.2",
               "msgspec.Meta(ge=0.0, le=1.0)] = 0.1"),
    )),
    Group("objectives", "ringtrain/drafter/objectives.py", OBJECTIVE_TESTS, (
        Mutant("gamma 4 for block 16", "PAPER_GAMMA = {16: 7.0,", "PAPER_GAMMA = {16: 4.0,"),
        Mutant("slot weights one slot early", "torch.exp(-(slots - 1) / loss_gamma(cfg))",
               "torch.exp(-slots / loss_gamma(cfg))"),
        Mutant("decayed CE weights shifted a slot",
               "slot_weights(self.cfg, scored.device, dtype)[1:] * scored",
               "slot_weights(self.cfg, scored.device, dtype)[:-1] * scored"),
        Mutant("D-PACE blocks one slot longer", "slots=cfg.block_size - 1",
               "slots=cfg.block_size"),
    )),
    Group("loss", "ringtrain/drafter/loss.py", OBJECTIVE_TESTS, (
        Mutant("D-PACE confidence squared",
               "alpha + (1.0 - alpha) * torch.exp(-ce.view(-1, slots))",
               "alpha + (1.0 - alpha) * torch.exp(-2 * ce.view(-1, slots))"),
        Mutant("D-PACE run length from the next slot",
               "from_here = reach.sum(1, keepdim=True) - reach.cumsum(1) + reach",
               "from_here = reach.sum(1, keepdim=True) - reach.cumsum(1)"),
        Mutant("chunk loss a mean", "_ScoredChunk(logits, lse, scale, (ce * scale).sum(),",
               "_ScoredChunk(logits, lse, scale, (ce * scale).mean(),"),
        Mutant("gradient without the row weights",
               "- one_hot.to(lse.dtype)) * scale[:, None]", "- one_hot.to(lse.dtype))"),
        Mutant("log-sum-exp without the groups' shift",
               "group_lse = shift + torch.log(", "group_lse = torch.log("),
        Mutant("a group of no finite entry shifted by its maximum",
               "torch.where(torch.isfinite(maxima), maxima, torch.zeros_like(maxima))",
               "maxima"),
        Mutant("argmax's group offset lost", "return best * groups.shape[2] + entries.argmax(-1)",
               "return best + entries.argmax(-1)"),
        Mutant("top ids from one group fewer", "first = row_topk(maxima.detach(), min(top_k, ",
               "first = row_topk(maxima.detach(), min(top_k - 1, "),
        Mutant("the candidates' logits in reverse order",
               "top_logits = logits.detach().gather(1, ids)",
               "top_logits = logits.detach().gather(1, ids.flip(1))"),
    )),
    Group("config errors", "ringtrain/config.py", CONFIG_TESTS, (
        Mutant("an override's value always text",
               "value = tomllib.loads(f\"v = {raw.strip()}\")[\"v\"]", "value = raw.strip()"),
        Mutant("a choice's error without its choices",
               "fix = f\"use one of {', '.join(map(repr, allowed))}\" if allowed else ",
               "fix = f\"use one of {', '.join(map(repr, allowed))}\" if False else "),
        Mutant("a bound's error without its advice",
               "if not allowed and re.search(r\"Expected `\\w+` [<>]\", str(exc)):",
               "if False:"),
        Mutant("an infinite float accepted",
               "elif isinstance(value, float) and not math.isfinite(value):",
               "elif isinstance(value, float) and math.isnan(value):"),
        Mutant("a nested section's floats unchecked",
               "            _check_finite(value, source, f\"{key}.\")", "            pass"),
        Mutant("the choices of a list's entries not found",
               "while typing.get_origin(kind) is list:", "while False:"),
        Mutant("the schedule's problem ignored",
               "if problem := schedule_problem(config.optim):", "if problem := None:"),
    )),
    Group("DFlash2 selector", "ringtrain/drafter/arch/dflash2/selector.py", SELECTOR_TESTS, (
        Mutant("the unary scores dropped", "return candidate_logits.clone()",
               "return candidate_logits.clone() * 0"),
        Mutant("the rows' gradient through the first candidate only",
               "grad_rows = (grad[..., None] * lm_head[candidates].to(grad.dtype)).sum(1)",
               "grad_rows = (grad[..., :1, None] * lm_head[candidates[:, :1]].to(grad.dtype)).sum(1)"),
        Mutant("a slot whose token misses the candidates adds to the loss",
               "return (loss * weights * hits.any(-1)).sum(), picked",
               "return (loss * weights).sum(), picked"),
        Mutant("each slot scored after its own token", "predecessors = labels[:, :-1].reshape(-1)",
               "predecessors = labels[:, 1:].reshape(-1)"),
        Mutant("the selector loss weight ignored",
               "return {\"selector_loss_sum\": self.weight * total}, hits",
               "return {\"selector_loss_sum\": total}, hits"),
        Mutant("the predecessor codebook ignored",
               "pair = torch.einsum(\"...r,...kr->...k\", gate, successors)",
               "pair = torch.einsum(\"...r,...kr->...k\", projected, successors)"),
        Mutant("the walk takes each slot's best logit",
               "predecessor = candidates[row].gather(-1, slot_scores.argmax(-1, keepdim=True))[:, 0]",
               "predecessor = candidates[row][:, 0]"),
        Mutant("the weight's bound without the per-slot loss",
               "largest = largest_float32 / (scored_slots * per_slot)",
               "largest = largest_float32 / scored_slots"),
    )),
    Group("output scale", "ringtrain/drafter/arch/dflash/model.py",
          ("tests/test_drafter_first_step.py",), (
        Mutant("output scale 0.3x", "scale = min(1.0, 1.0 / spread)",
               "scale = min(1.0, 0.3 / spread)"),
        Mutant("mask state not brought to RMS 1",
               "unit_rms = mask_embed * mask_embed.pow(2).mean().clamp_min(1e-12).rsqrt()",
               "unit_rms = mask_embed"),
    )),
    Group("schedules", "ringtrain/drafter/schedules.py", SCHEDULE_TESTS, (
        Mutant("warm-up one step late", "return (step + 1) / self.warmup_steps",
               "return step / self.warmup_steps"),
        Mutant("cosine a quarter period", "cosine = 0.5 * (1.0 + math.cos(math.pi * progress))",
               "cosine = 0.5 * (1.0 + math.cos(0.5 * math.pi * progress))"),
        Mutant("wsd decay linear", "(1.0 - math.sqrt(progress))", "(1.0 - progress)"),
        Mutant("wsd decay one step longer", "decay_steps = round(decay_fraction * total_steps)",
               "decay_steps = round(decay_fraction * total_steps) + 1"),
        Mutant("cosine ends above its floor",
               "return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine",
               "return self.min_lr_ratio + cosine"),
    )),
    Group("ring hand-off", "ringtrain/ring/ends.py", ("tests/test_ring.py",), (
        Mutant("slot handed back before its copy",
               "            entry.destination.copy_(entry.source)\n            self._free_slot(slot)",
               "            self._free_slot(slot)\n            entry.destination.copy_(entry.source)"),
        Mutant("slot left READING when handed back",
               "        self._control.slot_state[slot] = cb.FREE\n", ""),
    )),
    Group("checkpoint verification", "ringtrain/checkpoint/verify.py", CHECKPOINT_TESTS, (
        Mutant("a missing file passes", "if version[0] < 0:", "if version[0] < -1:"),
        Mutant("infinite weights pass", "count = int((~torch.isfinite(tensor)).sum())",
               "count = int(torch.isnan(tensor).sum())"),
        Mutant("a bad newest checkpoint is used", "if problem is not None:",
               "if problem is None and False:"),
        Mutant("checkpoints of no run id skipped", "not in (None, run_id):",
               "not in (run_id,):"),
    )),
    Group("checkpoint retention", "ringtrain/checkpoint/retention.py", RETENTION_TESTS, (
        Mutant("one checkpoint more deleted", "for entry in older[keep - 1 :]:",
               "for entry in older[keep - 2 :]:"),
        Mutant("one checkpoint more kept", "for entry in older[keep - 1 :]:",
               "for entry in older[keep:]:"),
        Mutant("the one just written may go",
               "if entry.name != written.name]", "if entry.name != \"\"]"),
        Mutant("keep 0 deletes", "if keep == 0:", "if keep < 0:"),
    )),
    Group("checkpoint layout", "ringtrain/checkpoint/layout.py", RETENTION_TESTS, (
        Mutant("checkpoints oldest first", "        reverse=True,\n    )\n    return [entry",
               "        reverse=False,\n    )\n    return [entry"),
        Mutant("steps ordered as text", "(int(match.group(1)), entry)",
               "(match.group(1), entry)"),
        Mutant("an incomplete checkpoint counts",
               "if all((entry / f).is_file() for f in REQUIRED_FILES)]",
               "if any((entry / f).is_file() for f in REQUIRED_FILES)]"),
        Mutant("a user's step_N_copy counts as a step", "STEP_DIR = re.compile(r\"^step_(\\d+)$\")",
               "STEP_DIR = re.compile(r\"^step_(\\d+)\")"),
    )),
    Group("held-out replay", "ringtrain/drafter/heldout.py", HELDOUT_TESTS, (
        Mutant("tau_sim steps per token",
               "metrics[\"tau_sim\"] = tokens / steps if steps else 0.0",
               "metrics[\"tau_sim\"] = steps / tokens if tokens else 0.0"),
        Mutant("a step moves past the accepted tokens only",
               "step_to = (row + accepted.long() + 1).clamp(max=rows)",
               "step_to = (row + accepted.long()).clamp(max=rows)"),
        Mutant("a span starts only at a document's start",
               "span_start = supervised[:rows] & (doc_start | ~previous)",
               "span_start = supervised[:rows] & doc_start"),
        Mutant("a step may land in the next span", " & (span[step_to_in] == span)", ""),
        Mutant("a step's tokens without the target's own",
               "tokens = torch.cat((torch.where(eligible, accepted.long() + 1, 0)",
               "tokens = torch.cat((torch.where(eligible, accepted.long(), 0)"),
    )),
    Group("step sums", "ringtrain/drafter/sums.py", SUMS_TESTS, (
        Mutant("tau_uniform without the target's token",
               "\"tau_uniform\": 1.0 + sums[\"accepted_sum\"] / max(blocks, 1.0)",
               "\"tau_uniform\": sums[\"accepted_sum\"] / max(blocks, 1.0)"),
        Mutant("accuracy per block, not per label",
               "\"accuracy\": sum(correct) / max(sum(counted), 1.0)",
               "\"accuracy\": sum(correct) / max(blocks, 1.0)"),
        Mutant("loss per block, not per weight",
               "\"loss\": sums[\"loss_sum\"] / weight_sum",
               "\"loss\": sums[\"loss_sum\"] / max(blocks, 1.0)"),
    )),
    Group("progress lines", "ringtrain/trainer/progress.py", ("tests/test_progress_lines.py",), (
        Mutant("a batch's tokens are the window's",
               "self._window_tokens / max(self._window_items, 1))",
               "self._window_tokens)"),
        Mutant("a window's tokens carried into the next",
               "self._window_start, self._window_tokens, self._window_items = now, 0, 0",
               "self._window_start, self._window_items = now, 0"),
        Mutant("acc@1 of the last slot", "record.accuracy[0],", "record.accuracy[-1],"),
        Mutant("no line at the last step",
               "if record.step % self._every and record.step != self._max_steps:",
               "if record.step % self._every:"),
        Mutant("the summary counts the start-up", "start = self._after_first", "start = None"),
        Mutant("a resumed session counts the run's steps",
               "count = last_step - self._resumed_step", "count = last_step"),
    )),
    Group("data mixture", "ringtrain/data/mixture.py", ("tests/test_data_mixture.py",), (
        Mutant("shares rounded down only", "    for i in by_remainder[: total - sum(counts)]:\n        counts[i] += 1\n",
               ""),
        Mutant("the smallest remainders rounded up",
               "key=lambda i: (counts[i] - exact[i], i))", "key=lambda i: (exact[i] - counts[i], i))"),
        Mutant("a source's weight ignored", "exact = [total * w / sum(weights) for w in weights]",
               "exact = [total / len(weights) for w in weights]"),
        Mutant("fixed rows counted twice", "total = mixture.rows - fixed", "total = mixture.rows"),
        Mutant("a source's draw repeats before every line is used",
               "return list(range(lines)) * passes + sorted(rng.sample(range(lines), rest))",
               "return sorted(rng.choices(range(lines), k=count))"),
        Mutant("every source drawn with one seed", "rng = random.Random(f\"{mixture.seed}/{source.name}\")",
               "rng = random.Random(mixture.seed)"),
    )),
    Group("resume checks", "ringtrain/checkpoint/resume_checks.py",
          ("tests/test_resume_identity.py", "tests/test_resume_guard.py", "tests/test_optim_choices.py",
           "tests/test_drafter_checkpoint.py"), (
        Mutant("a changed setting passes", "if field == \"data_path\" or was == now:",
               "if field == \"data_path\" or was != now:"),
        Mutant("a moved dataset refused", "if field == \"data_path\" or was == now:",
               "if was == now:"),
        Mutant("the row lengths not hashed",
               "np.ascontiguousarray(dataset.row_length, dtype=np.int64).tobytes(), digest_size=8",
               "np.ascontiguousarray(dataset.row_length[:1], dtype=np.int64).tobytes(), digest_size=8"),
        Mutant("the target count not recorded", "        targets=targets,\n", "        targets=1,\n"),
        Mutant("another optimiser's state accepted", "if saved != cfg.name:", "if False:"),
        Mutant("another drafter shape accepted", "if saved == spec:\n        return",
               "if True:\n        return"),
        Mutant("the data seed not recorded", "data_seed=config.data.seed,", "data_seed=0,"),
    )),
    Group("batch stream", "ringtrain/data/batching.py", ("tests/test_data_batching.py",), (
        Mutant("a batch one row over its budget", "capacity = token_budget // widths",
               "capacity = token_budget // widths + 1"),
        Mutant("every epoch in one order", "rng = np.random.default_rng([seed, epoch])",
               "rng = np.random.default_rng([seed, 0])"),
        Mutant("every rank takes the same batches", "return epoch, self.rank + local * self.world",
               "return epoch, local * self.world"),
        Mutant("a skipped batch trained", "while self._next_seq in self._skip:", "while False:"),
        Mutant("positions run on across documents",
               "doc_first = np.repeat(cu[:-1].astype(np.int64), lengths)",
               "doc_first = np.zeros(tokens, dtype=np.int64)"),
        Mutant("batch ids of one epoch repeat in the next",
               "batch_id=epoch * BATCH_ID_STRIDE + index,", "batch_id=index,"),
    )),
    Group("target progress", "ringtrain/trainer/target_progress.py",
          ("tests/test_target_progress.py",), (
        Mutant("a line every forward", "if step // self._every > self._line_step // self._every:",
               "if True:"),
        Mutant("the resumed step ignored", "return max(self._resumed_step, self._ring.consumer_step())",
               "return self._ring.consumer_step()"),
        Mutant("a window's tokens carried into the next",
               "self._before, self._window_start, self._window_tokens = current, now_s, 0",
               "self._before, self._window_start = current, now_s"),
        Mutant("the wait since the session began", "self._before, self._window_start, self._window_tokens = current, now_s, 0",
               "self._window_start, self._window_tokens = now_s, 0"),
        Mutant("another rank's wait", "mine = next((r for r in window.ranks if r.pid == os.getpid()), None)",
               "mine = next((r for r in window.ranks if r.pid != os.getpid()), None)"),
    )),
    Group("split advice", "ringtrain/monitor/advice.py", ADVICE_TESTS, (
        Mutant("a split moves what its faster role can",
               "return min(targets * rates.target_rate, drafters * rates.drafter_rate)",
               "return max(targets * rates.target_rate, drafters * rates.drafter_rate)"),
        Mutant("ties keep fewer targets", "for t in range((rates.gpus - 1) // k, 0, -1)",
               "for t in range(1, (rates.gpus - 1) // k + 1)"),
        Mutant("a shared GPU saturates at its least load", "return 1.0 / max(loads)",
               "return 1.0 / min(loads)"),
        Mutant("any shared GPUs count as co-located",
               "colocated = shared and all(len(roles) == 2 for roles in roles_by_device.values())",
               "colocated = shared"),
        Mutant("a target group counts each of its ranks",
               "targets=sum(r.role == \"target\" for r in ranks) // gpus_per_target,",
               "targets=sum(r.role == \"target\" for r in ranks),"),
        Mutant("an option no faster than now is advised", "if rate <= (reference := _reference(rates)):",
               "if rate < 0 * (reference := _reference(rates)):"),
        Mutant("shared ranks compared by arithmetic", "if rates.shared and rates.measured:\n        return rates.measured",
               "if False:\n        return rates.measured"),
    )),
    Group("ring figures", "ringtrain/monitor/ring_figures.py", RING_FIGURE_TESTS, (
        Mutant("a target's wait is its starved time",
               "waited_ns = rank.blocked_ns if rank.end == PRODUCER else rank.starved_ns",
               "waited_ns = rank.starved_ns if rank.end == PRODUCER else rank.blocked_ns"),
        Mutant("the rate while working over the whole interval",
               "return self.items / self.working_s if self.working_s > 0",
               "return self.items / self.seconds if self.working_s > 0"),
        Mutant("a restarted ring's counters subtracted",
               "if then is None or now.up_s < then.up_s:", "if then is None:"),
        Mutant("a role's mean over ranks without a rate",
               "values = [v for v in values if v is not None]",
               "values = [v or 0.0 for v in values]"),
        Mutant("wait share unbounded",
               "return min(max(self.waited_s / self.seconds, 0.0), 1.0) if",
               "return (self.waited_s / self.seconds) if"),
    )),
    Group("ring snapshot", "ringtrain/ring/snapshot.py",
          ("tests/test_stat.py", "tests/test_monitor_stat.py", "tests/test_monitor_verdict.py",
           "tests/test_progress_lines.py", "tests/test_ring_failures.py"), (
        Mutant("the consumers limit while starving more",
               "if blocked_pct >= BOTTLENECK_PCT and blocked_pct >= starved_pct:",
               "if blocked_pct >= BOTTLENECK_PCT:"),
        Mutant("a bottleneck at any wait", "BOTTLENECK_PCT = 10.0", "BOTTLENECK_PCT = 0.0"),
        Mutant("a failed rank not dead", "    if status == cb.FAILED:\n        return FAILED_REASON\n",
               ""),
        Mutant("a stale heartbeat not dead", "if age_s * 1e9 > heartbeat_timeout_ns:",
               "if age_s * 1e9 > 1000 * heartbeat_timeout_ns:"),
        Mutant("a hung rank not fatal", "if hung := [r for r in ranks if r.hung_reason]:",
               "if hung := []:"),
        Mutant("the interval's rate over all items",
               "interval_items_per_s=(r.items - p.items) * 1e9 / span_ns,",
               "interval_items_per_s=r.items * 1e9 / span_ns,"),
        Mutant("the ring's rate from the targets",
               "consumed = sum(r.interval_items_per_s for r in ranks if r.is_consumer)",
               "consumed = sum(r.interval_items_per_s for r in ranks if r.is_producer)"),
    )),
    Group("liveness verdicts", "ringtrain/ring/phases.py", LIVENESS_TESTS, (
        Mutant("a rank past its allowance but working is hung",
               "if age <= limit or idle <= limit:", "if age <= limit:"),
        Mutant("a wait on peers is no work", "if activity.moved or activity.waits_on_peers or busy:",
               "if activity.moved or busy:"),
        Mutant("CPU use in one place is work for ever", "busy = activity.busy and in_place_s <= ",
               "busy = activity.busy or in_place_s <= "),
        Mutant("the rank with more completed waits is behind",
               "            int(ranks[i][\"peer_waits_done\"]),\n",
               "            -int(ranks[i][\"peer_waits_done\"]),\n"),
        Mutant("where a rank waits is not asked", "            int(ranks[i][\"in_torch\"]),\n",
               "            0,\n"),
        Mutant("the first to enter the shared wait is behind",
               "-int(ranks[i][\"peer_wait_ns\"]),", "int(ranks[i][\"peer_wait_ns\"]),"),
        Mutant("a group with a rank on another host is judged",
               "if not waiting or any(int(ranks[i][\"peer_group\"]) != len(waiting) for i in waiting):",
               "if not waiting:"),
    )),
)  # fmt: skip


def run_tests(clone: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[bool, float]:
    """(whether the tests passed, seconds) in `clone`."""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, *PYTEST, *tests], cwd=clone, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s,
        )  # fmt: skip
        passed = done.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False
    return passed, time.monotonic() - started


def check_group(clone: Path, group: Group, timeout_s: float) -> list[dict]:
    """One result per mutant of `group` (none when its tests fail unchanged)."""
    passed, seconds = run_tests(clone, group.tests, timeout_s)
    print(f"{group.name}: unchanged tests {'pass' if passed else 'FAIL'} ({seconds:.0f} s)")
    if not passed:
        return [{"group": group.name, "mutant": "(unchanged)", "killed": None}]
    source = clone / group.module
    original = source.read_text()
    results = []
    for mutant in group.mutants:
        if original.count(mutant.old) != 1:
            raise SystemExit(f"{group.module}: the text of {mutant.label!r} is not there once")
        source.write_text(original.replace(mutant.old, mutant.new))
        try:
            survived, seconds = run_tests(clone, group.tests, timeout_s)
        finally:
            source.write_text(original)
        verdict = "survived" if survived else "killed"
        print(f"  {verdict:<8} {seconds:5.0f} s  {mutant.label}", flush=True)
        results.append(
            {"group": group.name, "module": group.module, "mutant": mutant.label,
             "killed": not survived, "seconds": round(seconds, 1)}
        )  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", type=Path, help="a directory to clone the project into")
    parser.add_argument("--only", action="append", default=[], help="groups whose name has this")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    groups = [g for g in MUTANTS if not args.only or any(o in g.name for o in args.only)]
    if args.list:
        for group in groups:
            print(f"{group.name} ({group.module}; {' '.join(group.tests)})")
            print("".join(f"  {m.label}\n" for m in group.mutants), end="")
        return 0
    if args.clone is None or args.clone.exists():
        parser.error("--clone must name a directory that does not exist yet")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(args.clone)], check=True)
    results = [r for group in groups for r in check_group(args.clone, group, args.timeout)]
    judged = [r for r in results if r["killed"] is not None]
    killed = sum(r["killed"] for r in judged)
    print(f"{killed} of {len(judged)} mutants killed")
    print(json.dumps({"killed": killed, "mutants": len(judged), "results": results}))
    return 0 if killed == len(judged) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
