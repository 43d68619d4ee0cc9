"""``python -m corral``: the same as the ``corral`` command."""

from corral.services.cli.main import main

main()
