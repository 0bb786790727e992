"""Benchmarks: each prints a table and ends with one JSON line, measuring the library's own
code (never a copy of it).
"""
