"""``python -m workbench`` runs the CLI."""

from .cli import entry_point

entry_point()
