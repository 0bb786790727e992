"""Target models: loading, tapped-layer forward passes, the built-in tiny target."""
