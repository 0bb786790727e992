"""Watching a run: scalar sinks (TensorBoard, W&B), the run's picture, role-split advice.

Everything here reads what the trainer records (metrics.jsonl records, ring snapshots)
and never takes part in training.
"""
