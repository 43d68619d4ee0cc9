"""``python -m corral``: the same as the ``corral`` command."""

from corral.services.cli import main

main()
