"""The ``tracea`` command line. Subcommands live in ``tracea.cli.<name>_cmd`` modules, each with a
``register(subparsers)`` that adds its parser and sets ``func(args) -> exit code``."""

from __future__ import annotations

import argparse
import importlib
import sys

from .._version import __version__
from ..errors import TraceaError

COMMANDS = ("doctor", "tune", "cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracea", description="Tracea: fast kernels on whatever hardware you have.")
    parser.add_argument("--version", action="version", version=f"tracea {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"tracea.cli.{name}_cmd")
        except ImportError:
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tracea`` script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except TraceaError as exc:
        print(f"tracea: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
