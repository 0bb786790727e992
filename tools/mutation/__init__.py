"""The mutation check of the modules that compute what users read (check.py)."""
