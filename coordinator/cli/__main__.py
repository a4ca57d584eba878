"""``python -m coordinator.cli``: the ``cutline`` command line."""

from coordinator.cli import main

if __name__ == "__main__":
    main()
