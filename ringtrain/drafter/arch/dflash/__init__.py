"""DFlash: the paper's drafter; each block slot proposes its argmax, the loss is the
slots' cross-entropy alone."""

from ringtrain.drafter.arch.base import Architecture
from ringtrain.drafter.arch.dflash.model import DFlashDrafter

ARCHITECTURE = Architecture(hf_name="DFlashDraftModel", model=DFlashDrafter)
