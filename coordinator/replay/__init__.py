"""The journal offline: journal files, ``replay`` (selection, ``--verify`` on one or two processes),
timelines, plots, and what the journal says of a command-line request."""
