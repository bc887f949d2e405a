"""Subcommands of the `attnlens` command line that live in their own modules, and what
the commands share: `UsageError`, the argparse type `count`."""

import argparse


class UsageError(SystemExit):
    """A bad command-line argument found before any work: `attnlens` prints it as one line
    (`attnlens CMD: error: ...`) and exits with status 2, as argparse does for its own."""

    def __init__(self, command: str, message: str):
        super().__init__(2)
        self.command, self.message = command, message

    def __str__(self) -> str:
        return f"attnlens {self.command}: {self.message}"


def count(minimum: int):
    """An argparse type: an int >= `minimum` (a negative count is no count: `--show -5` is not
    "all but the last 5")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = f"int>={minimum}"
    return parse
