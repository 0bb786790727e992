"""The trainer: rank roles, the target and drafter loops, logging and the batch ledger."""
