"""ringtrain: train DFlash speculative-decoding drafters with target and drafter ranks
in separate processes, joined by a node-local shared-memory ring buffer."""

__version__ = "0.1.0"
