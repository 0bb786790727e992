"""The project's scripts: benchmarks and recipes.

A package, so that each script runs as a module from the project root
(`python -m tools.bench.bench_ring`); it is not part of the installed library. Fixtures
the scripts share with the tests are in ringtrain.testing.
"""
