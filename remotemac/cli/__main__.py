"""``python -m remotemac.cli``: the same entry as the console script."""

from remotemac.cli.core import entry

if __name__ == "__main__":  # pragma: no cover
    entry()
