"""The project's scripts: benchmarks, recipes, a stand-in chat server.

A package, so that each script runs as a module from the project root
(`python -m tools.bench.bench_ring`) or by its path from anywhere once the project is
installed (`tools/setup_env.sh` installs it in editable mode).
"""
