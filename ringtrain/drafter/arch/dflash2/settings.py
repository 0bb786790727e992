"""DFlash2's own spec fields: the in-block convolution's taps and group size, the selector's
rank and top-k (the serving engines' defaults; [drafter] keys of the same names, and
dflash_config keys of every DFlash2 checkpoint, which the engines require)."""

from __future__ import annotations

from ringtrain.drafter.spec import ArchitectureSettings, DrafterSpec


class DFlash2Settings(ArchitectureSettings, frozen=True, kw_only=True):
    """Taps and channels per dynamic tap correction of the in-block convolution, rank of
    the selector's token codebooks and the candidates per slot its walk goes through."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

    def validate(self, spec: DrafterSpec) -> None:
        """Raise ValueError naming a field that does not fit `spec`."""
        if spec.hidden_size % self.conv_group_size:
            raise ValueError(
                f"[drafter] conv_group_size={self.conv_group_size} must divide the hidden size "
                f"{spec.hidden_size}"
            )
        if self.conv_kernel_size > spec.block_size:
            raise ValueError(
                f"[drafter] conv_kernel_size={self.conv_kernel_size} exceeds "
                f"block_size={spec.block_size}; the convolution never reaches past a block"
            )
        if self.selector_top_k > spec.vocab_size:
            raise ValueError(
                f"[drafter] selector_top_k={self.selector_top_k} exceeds the vocabulary "
                f"({spec.vocab_size} tokens)"
            )
