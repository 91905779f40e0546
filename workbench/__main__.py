"""``python -m workbench`` runs the CLI."""

from .cli.main import entry_point

entry_point()
