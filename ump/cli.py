"""``ump``: the single command-line entry point.

Each top-level folder contributes its subcommands through a ``register(subparsers)`` function
in its own ``cli`` module (``wire/cli.py`` gives ``ump dissect``), so the command grows with the
project without this file knowing the details.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Folder modules that add subcommands, in the order they appear in ``ump --help``.
COMMAND_MODULES = (
    "wire.cli", "reference_impl.cli", "captures.cli", "spark_analysis.cli", "conformance.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ump",
        description="Conformance and interop harness for Ultra Messaging persistence (UMP).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        print("ump: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
