"""Which target layers feed the drafter: the DFlash default spread, its validation, and
what a tap of the last layer means.

Tap i is Hugging Face's ``hidden_states[i + 1]``: the output of decoder layer i. For the
last layer (i = L-1) that entry is taken AFTER the model's final norm, and the DFlash
reference trains on it so; ringtrain does the same (the final norm is then loaded and
applied to that tap only). Serving engines capture a tap of layer i as the residual
stream entering layer i+1 (SGLang and vLLM both shift the configured ids by one), which
does not exist for the last layer: a drafter tapping L-1 matches the reference model but
is not servable by those engines, so the default spread stops at L-3 and a tap of L-1 is
logged with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence


def default_tap_layers(num_layers: int, k: int) -> list[int]:
    """DFlash's tapped layers: ``round(1 + i*(L-4)/(K-1))`` for i in 0..K-1.

    ``num_layers`` is the target's FULL layer count L; the K layers spread evenly from
    layer 1 to layer L-3. ``round`` is Python's (half to even). ``k == 1`` gives [1].
    """
    if k < 1:
        raise ValueError(f"num_taps must be at least 1, got {k}")
    if num_layers < 4:
        raise ValueError(
            f"the DFlash tap spread needs a target with at least 4 layers, this one has "
            f"{num_layers}; list the tapped layers explicitly (target.tap_layers)"
        )
    if k == 1:
        return [1]
    layers = [round(1 + i * (num_layers - 4) / (k - 1)) for i in range(k)]
    if len(set(layers)) != k:
        raise ValueError(
            f"{k} taps do not fit between layers 1 and {num_layers - 3} of a {num_layers}-layer "
            f"target without repeats; lower target.num_taps to at most {num_layers - 3}"
        )
    return layers


def taps_final_norm(tap_layers: Sequence[int], num_layers: int) -> bool:
    """Whether a tap of the last layer needs the model's final norm (see the module doc)."""
    return num_layers - 1 in tap_layers


def check_tap_layers(tap_layers: Sequence[int], num_layers: int, source: str) -> list[int]:
    """Validate explicit tapped layer indices against the target's layer count.

    Raises ValueError naming ``source`` (the target directory), the bad index and the
    valid range. Returns the indices as a list, in the given order.
    """
    layers = [int(i) for i in tap_layers]
    if not layers:
        raise ValueError(f"{source}: no tapped layers given; list at least one (target.tap_layers)")
    for index in layers:
        if not 0 <= index < num_layers:
            raise ValueError(
                f"{source}: tapped layer {index} is out of range; this target has {num_layers} "
                f"layers, so valid indices are 0..{num_layers - 1} (fix target.tap_layers)"
            )
    if len(set(layers)) != len(layers):
        raise ValueError(f"{source}: tapped layers {layers} repeat an index; list each layer once")
    return layers
