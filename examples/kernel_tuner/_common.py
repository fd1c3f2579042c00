"""Shared bits of the example scripts: pick the tuner module from the command line."""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def tuner_from_args(description: str) -> tuple[Any, argparse.Namespace]:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tuner", default="tracea", help="module with tune_kernel: tracea (default) or kernel_tuner")
    p.add_argument("--strategy", default=None)
    p.add_argument("--small", action="store_true", help="a small problem (tests, CI)")
    args = p.parse_args()
    return importlib.import_module(args.tuner), args
