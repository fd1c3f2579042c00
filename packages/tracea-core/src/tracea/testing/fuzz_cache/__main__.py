"""``python -m tracea.testing.fuzz_cache [--cases N] [--minutes M] [--seed S] [--report FILE]``:
fuzz the tuning cache and print the summary table; exit status 1 when anything was found."""

from __future__ import annotations

import argparse
import sys

from . import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracea.testing.fuzz_cache", description=__doc__)
    p.add_argument("--cases", type=int, default=None, help="number of cases (default 1000 without --minutes)")
    p.add_argument("--minutes", type=float, default=None, help="stop starting batches after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--batch", type=int, default=40, help="cases per child process")
    p.add_argument("--jobs", type=int, default=1, help="child processes at once")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds after which a case counts as hung")
    p.add_argument("--no-concurrency", action="store_true", help="skip the multi-process scenarios")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)

    def progress(s):  # noqa: ANN001
        found = sum(s.counts.values())
        print(f"  {s.cases} cases, {s.elapsed_s:.0f} s, {found} findings", file=sys.stderr, flush=True)

    summary = run(args.cases, args.minutes, args.seed, args.report, batch=args.batch, jobs=args.jobs,
                  case_timeout=args.timeout, concurrency=not args.no_concurrency,
                  progress=None if args.quiet else progress)
    print(summary.table())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
