"""Core CLI commands: each module has ``register(cli: click.Group)``."""
