"""DFlash2: DFlash plus an in-block dynamic convolution and a top-k path selector, whose
walk proposes the block and whose cross-entropy joins the loss (docs/dflash2.md)."""

from ringtrain.drafter.arch.base import Architecture
from ringtrain.drafter.arch.dflash2.model import DFlash2Drafter
from ringtrain.drafter.arch.dflash2.selector import (
    SelectorSums,
    SelectorTerm,
    check_selector_weight,
)
from ringtrain.drafter.arch.dflash2.settings import DFlash2Settings

ARCHITECTURE = Architecture(
    hf_name="DFlash2DraftModel",
    model=DFlash2Drafter,
    settings=DFlash2Settings,
    block_term=SelectorTerm,
    sums_type=SelectorSums,
    check_limits=check_selector_weight,
)
