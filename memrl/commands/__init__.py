"""CLI subcommands, one module each (see memrl/cli.py)."""
