"""``python -m firstlight`` runs the CLI."""

from firstlight.cli import main

main()
