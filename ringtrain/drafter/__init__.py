"""The DFlash drafter: model, block objective, metrics, optimiser and checkpoints."""
