"""The mutation check of the modules that compute what users read (check.py runs the
mutants of mutants.py)."""
