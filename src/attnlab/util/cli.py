"""How every ``attnlab`` command parses its options: argparse with one ``attnlab: error: ...`` line and
exit 2 on bad input. In util so the core's entry points (data/prepare.py, the bench) need not import the
dispatcher, ``attnlab.cli``."""

from __future__ import annotations

import argparse
import sys

ERROR_PREFIX = "attnlab: error: "


class CommandParser(argparse.ArgumentParser):
    """argparse with attnlab's error line: usage, then ``attnlab: error: ...``, exit 2."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{ERROR_PREFIX}{message}\n")


def command_parser(command: str, description: str | None = None) -> CommandParser:
    """The argument parser of ``attnlab <command>`` (also used by ``python -m attnlab.<module>``)."""
    return CommandParser(prog=f"attnlab {command}", description=description)
