"""Command-line tools: ringtrain-stat, ringtrain-data, ringtrain-eval; and the command line
of a training run (train_args), which ringtrain.main and ringtrain-launch share."""
