"""The mutation check of the modules that compute what users read (check.py runs the
mutants that mutants.py joins from groups/)."""
