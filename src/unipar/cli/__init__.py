"""The ``unipar`` command line: :mod:`unipar.cli.main` builds the parser; one module per
command."""
