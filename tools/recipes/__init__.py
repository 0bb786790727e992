"""Recipes: the toy target, its data, the toy recipe and its sweeps, the chaos run."""
