"""The mutation check's groups of mutants, a module per area of the project (mutants.py
joins them)."""
