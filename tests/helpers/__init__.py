"""Shared pieces of the test suite: tiny models and drafters, run launchers, stand-ins.

Tests import them as ``from tests.helpers.<module> import ...``; no test imports another
test file.
"""
