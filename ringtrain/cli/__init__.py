"""Command-line tools: ringtrain-stat, ringtrain-data, ringtrain-eval."""
