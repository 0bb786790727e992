"""Arrow datasets, token-budget batching and dataset preparation."""
