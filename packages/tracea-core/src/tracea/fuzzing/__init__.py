"""Fuzzing harnesses that keep Tracea honest against crashes, hangs, wrong results and bad errors.

The ops fuzzer (``python -m tracea.fuzzing``, ``python3 dev.py fuzz``) generates seeded random calls of
``tracea.ops.matmul`` / ``gemm`` / ``conv2d`` / ``attention`` on NumPy arrays and torch tensors (CuPy
arrays and CUDA tensors with ``--device cuda``), runs them in worker processes with a per-case timeout
and judges each against a float64 reference. See ``docs/fuzzing.md``.

Modules: :mod:`.cases` (the generator), :mod:`.arrays` (building arrays of every layout),
:mod:`.reference` (float64 results), :mod:`.oracle` (bounds and verdicts), :mod:`.known_issues`,
:mod:`.recorder` (which backend ran), :mod:`.worker` (running a case), :mod:`.runner` (processes,
timeouts, report), :mod:`.sanitize` (compute-sanitizer replays).

Importing this package imports neither torch nor CuPy; cases that need them import them.
"""

from __future__ import annotations

from .cases import Case, generate

__all__ = ["Case", "generate"]
