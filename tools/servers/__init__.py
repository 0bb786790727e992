"""Stand-in servers: an OpenAI-compatible chat server that answers deterministically."""
