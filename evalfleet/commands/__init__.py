"""CLI subcommands, one module per area; each exposes ``register(group)``."""
