"""Which split of a node's GPUs into targets and drafters would train fastest.

Pure arithmetic over measured rates. A target rank's rate while not blocked on a full ring
is what it can produce; a drafter rank's rate while not starved on an empty ring is what it
can consume. With T targets and D drafters the node then moves min(T x target, D x drafter);
the advice tries every split of the node's GPUs, compares with the run as measured, and,
when a co-located rate is known (one target and one drafter per GPU under MPS, measured per
GPU), with co-location. A tensor-parallel target group is one target that takes k GPUs:
splits then give each target k GPUs. The arithmetic is shown so the reader can check it.

`conclusion` is the one judgement of which option is fastest: the split analysis ends with
it and the ring's one-line verdict (verdict.py) repeats it, so the two never disagree.
Splits are compared with the current split by the same arithmetic (predicted against
predicted); where ranks share GPUs, for which there is no prediction, with the measured rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtrain.monitor.ring_figures import RankInterval, role_mean


@dataclass(frozen=True)
class MeasuredRates:
    """What a run measured, per node."""

    targets: int  # targets now (target groups: one per group)
    drafters: int  # drafter ranks now
    target_rate: float  # one target's rate while not blocked
    drafter_rate: float  # one drafter's rate while not starved
    gpus: int  # GPUs the run uses on the node (processes on CPU)
    measured: float | None = None  # the node's measured rate (None: unknown)
    colocated_rate: float | None = None  # per GPU, one target + one drafter sharing it
    shared: bool = False  # ranks of this run share GPUs (the rates are shared-GPU rates)
    unit: str = "tok/s"
    device: str = "GPU"
    gpus_per_target: int = 1  # a tensor-parallel target group's size


@dataclass(frozen=True)
class Split:
    """A split of the node's GPUs and the rate the measured per-rank rates predict for it."""

    targets: int
    drafters: int
    rate: float


def measured_rates(
    ranks: list[RankInterval], tokens_per_item: float | None = None, gpus_per_target: int = 1
) -> MeasuredRates | None:
    """The rates of one node's ranks over an interval (None: a role has no rate yet).

    Rates are in tokens/s given the mean tokens per item, else in batches/s. With target
    groups of `gpus_per_target` ranks only a group's lead moves items, so the target rate
    is the leads' (members, with no items, have none) and each group counts once. Ranks on CPU
    (device -1) count one process each; on GPUs, ranks of one device share it, and when
    every shared device holds both a target and a drafter the measured rate per device is
    the co-located rate."""
    target_rate = role_mean(ranks, "target", "items_per_working_s")
    drafter_rate = role_mean(ranks, "drafter", "items_per_working_s")
    if target_rate is None or drafter_rate is None:
        return None
    scale = tokens_per_item or 1.0
    measured = scale * sum(r.items_per_s for r in ranks if r.role == "drafter")
    on_cpu = any(r.device < 0 for r in ranks)
    roles_by_device: dict[int, set[str]] = {}
    for r in ranks:
        roles_by_device.setdefault(r.rank if on_cpu else r.device, set()).add(r.role)
    gpus = len(roles_by_device)
    shared = gpus < len(ranks)
    colocated = shared and all(len(roles) == 2 for roles in roles_by_device.values())
    return MeasuredRates(
        targets=sum(r.role == "target" for r in ranks) // gpus_per_target,
        drafters=sum(r.role == "drafter" for r in ranks),
        target_rate=scale * target_rate,
        drafter_rate=scale * drafter_rate,
        gpus=gpus,
        measured=measured,
        colocated_rate=measured / gpus if colocated else None,
        shared=shared,
        unit="tok/s" if tokens_per_item else "batches/s",
        device="process" if on_cpu else "GPU",
        gpus_per_target=gpus_per_target,
    )


def split_rate(rates: MeasuredRates, targets: int, drafters: int) -> float:
    """The predicted node rate of `targets` targets and `drafters` drafters."""
    return min(targets * rates.target_rate, drafters * rates.drafter_rate)


def saturation_rate(
    target_rate: float,
    drafter_rate: float,
    producers: int,
    drafters: int,
    residents: list[tuple[int, int]],
) -> float:
    """The node rate at which its busiest GPU saturates when ranks may share GPUs.

    `target_rate` is one producer's standalone rate (a target, or a tensor-parallel target
    group on its GPUs together), `drafter_rate` one drafter's; `residents` holds, per GPU,
    the producers with a rank on it and the drafters on it. The producers share the tokens
    evenly and so do the drafters, and a target group keeps every one of its GPUs busy for
    its whole step, so a GPU holding g producers and d drafters is saturated at X when
    X * (g / producers / target_rate + d / drafters / drafter_rate) = 1; the rate is the
    least such X. With one rank per GPU it is split_rate's min(T x target, D x drafter).
    """
    loads = [
        held / producers / target_rate + drafting / drafters / drafter_rate
        for held, drafting in residents
    ]
    return 1.0 / max(loads)


def best_split(rates: MeasuredRates) -> Split | None:
    """The fastest split with one rank per GPU (ties keep more targets); None when the GPUs
    hold no target and a drafter."""
    k = rates.gpus_per_target
    splits = [
        Split(t, rates.gpus - k * t, split_rate(rates, t, rates.gpus - k * t))
        for t in range((rates.gpus - 1) // k, 0, -1)
    ]
    return max(splits, key=lambda s: s.rate) if splits else None


def number(value: float) -> str:
    """A rate in a short form: 1.21M, 110k, 43.2k, 9,120, 812, 3.41."""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e5:
        return f"{value / 1e3:.0f}k"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _plural(count: int, word: str) -> str:
    suffix = "" if count == 1 else "es" if word.endswith("s") else "s"
    return f"{count} {word}{suffix}"


def _arithmetic(rates: MeasuredRates, targets: int, drafters: int) -> str:
    return (
        f"{_split_name(rates, targets, drafters)}: "
        f"min({targets} x {number(rates.target_rate)}, {drafters} x "
        f"{number(rates.drafter_rate)}) = {number(split_rate(rates, targets, drafters))} "
        f"{rates.unit}"
    )


def advise(rates: MeasuredRates) -> list[str]:
    """The advice as lines of text: rates, the split now, the best split, co-location, and
    the conclusion."""
    unit, gpu = rates.unit, rates.device
    reference = _reference(rates)
    lines = [
        f"role split over the node's {_plural(rates.gpus, gpu)}: one {_target_word(rates)} makes "
        f"{number(rates.target_rate)} {unit} while not blocked, one drafter takes "
        f"{number(rates.drafter_rate)} {unit} while not starved",
    ]
    if rates.shared:
        lines += [
            f"  now  {_split_name(rates, rates.targets, rates.drafters)} sharing "
            f"{_plural(rates.gpus, gpu)}: measured {number(reference)} {unit}",
            f"  (shared-{gpu} rates: each rank would run at least this fast on a {gpu} of its own)",
        ]
    else:
        lines.append(
            "  now  "
            + _arithmetic(rates, rates.targets, rates.drafters)
            + (f" (measured {number(rates.measured)})" if rates.measured else "")
        )
    best = best_split(rates)
    if best is not None:
        now = not rates.shared and (best.targets, best.drafters) == (rates.targets, rates.drafters)
        lines.append(
            "  best "
            + _arithmetic(rates, best.targets, best.drafters)
            + (" (the split now)" if now else _ratio(best.rate, reference))
        )
    if rates.colocated_rate:
        colocated = rates.gpus * rates.colocated_rate
        lines.append(
            f"  co-located, one target + one drafter per {gpu} (measured "
            f"{number(rates.colocated_rate)} {unit} per {gpu}): {rates.gpus} x "
            f"{number(rates.colocated_rate)} = {number(colocated)} {unit}"
            + _ratio(colocated, reference)
        )
    lines.append(f"  => {conclusion(rates)}")
    return lines


def _reference(rates: MeasuredRates) -> float:
    """The rate the options are compared with: the current split's by the same arithmetic,
    or the measured one where ranks share GPUs (no arithmetic predicts a shared GPU)."""
    if rates.shared and rates.measured:
        return rates.measured
    return split_rate(rates, rates.targets, rates.drafters)


def _ratio(rate: float, reference: float) -> str:
    return f", {rate / reference:.2f}x now" if reference > 0 else ""


def _options(rates: MeasuredRates) -> list[tuple[float, str]]:
    """The options as (rate, name): the best split with one rank per GPU, then co-location."""
    options = []
    if (best := best_split(rates)) is not None:
        options.append((best.rate, _split_name(rates, best.targets, best.drafters)))
    if rates.colocated_rate:
        options.append(
            (
                rates.gpus * rates.colocated_rate,
                f"co-locating one target and one drafter per {rates.device}",
            )
        )
    return options


def conclusion(rates: MeasuredRates) -> str:
    """Which option is fastest, in words: the one judgement that both the split analysis and
    the ring's verdict line show."""
    options = _options(rates)
    if not options:
        return f"one {rates.device}: no split to choose"
    rate, name = max(options, key=lambda option: option[0])
    if name == _split_name(rates, rates.targets, rates.drafters):
        return "the current split is the fastest"
    if rate <= (reference := _reference(rates)):
        measured = "the measured " if rates.shared and rates.measured else "the current split's "
        return f"nothing here beats {measured}{number(reference)} {rates.unit}"
    return f"{name} would be fastest: ~{number(rate)} {rates.unit}"


def _target_word(rates: MeasuredRates) -> str:
    """ "target", or "target group" when a target takes several GPUs."""
    return "target" if rates.gpus_per_target == 1 else "target group"


def _split_name(rates: MeasuredRates, targets: int, drafters: int) -> str:
    k = rates.gpus_per_target
    groups = f" of {_plural(k, rates.device)}" if k > 1 else ""
    return f"{_plural(targets, _target_word(rates))}{groups} + {_plural(drafters, 'drafter')}"
