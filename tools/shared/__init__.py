"""Pieces shared by the benchmarks and the tests (random packed batches)."""
