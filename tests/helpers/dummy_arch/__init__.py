"""A dummy drafter architecture, written as a new architecture is (docs/architectures.md):
this folder is copied to ringtrain/drafter/arch/dummy/ in a copy of the package (see
tests/test_drafter_arch.py), never imported from here.

DFlash with a learned gate on its output, proposing each slot's argmax, and a loss part
of its own: the mean square of the slots' final hidden states (spread_loss)."""

from ringtrain.drafter.arch.dummy.model import ARCHITECTURE

__all__ = ["ARCHITECTURE"]
