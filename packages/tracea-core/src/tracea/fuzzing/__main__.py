"""``python -m tracea.fuzzing``: fuzz the public ops (see docs/fuzzing.md).

    python -m tracea.fuzzing --minutes 20 --jobs 2            # until the time is up
    python -m tracea.fuzzing --cases 2000 --seed 7            # cases 0..1999 of seed 7
    python -m tracea.fuzzing --replay 7:1234                  # one case, in this process
    python -m tracea.fuzzing --show 7:1234                    # print the call only
    python -m tracea.fuzzing --device cuda --cases 5000 --sanitize 50

Exit status: 0 when nothing was found, 1 when there are findings (or sanitizer errors), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tracea.fuzzing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=None, help="number of cases (default 1000 unless --minutes)")
    p.add_argument("--minutes", type=float, default=None, help="stop handing out cases after this long")
    p.add_argument("--seed", type=int, default=None, help="case stream (default: a new one, printed)")
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: CuPy arrays (when importable) and CUDA tensors, reference on the host")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds one case may take before it is a hang")
    p.add_argument("--report", default=None, help="JSON report path (default .tracea/fuzz/ops-SEED.json)")
    p.add_argument("--known-issues", action="store_true",
                   help="tolerate the defects listed in tracea.fuzzing.known_issues (default: report them)")
    p.add_argument("--use-tuning-cache", action="store_true",
                   help="let dispatch read the user's tuning cache (default: an empty one per run)")
    p.add_argument("--sanitize", type=int, default=0, metavar="K",
                   help="then replay K sampled cases, each alone under the sanitizer command")
    p.add_argument("--sanitizer-cmd", default=None,
                   help="command prefix for --sanitize (default: compute-sanitizer --tool memcheck --error-exitcode 99)")
    p.add_argument("--replay", metavar="SEED:INDEX", help="run one case in this process and print the verdict")
    p.add_argument("--show", metavar="SEED:INDEX", help="print one case's call without running it")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def _seed_index(text: str) -> tuple[int, int]:
    seed, _, index = text.partition(":")
    return int(seed), int(index)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        from .worker import serve

        return serve(args.device, True if args.known_issues else None)
    if args.show:
        from .cases import generate

        case = generate(*_seed_index(args.show))
        print(case.call_text())
        print("# expect:", case.expect, *(f"\n#   {n}" for n in case.notes))
        return 0
    if args.replay:
        return _replay(args)
    return _run(args)


def _replay(args: argparse.Namespace) -> int:
    from .cases import generate
    from .worker import run_case

    seed, index = _seed_index(args.replay)
    print(generate(seed, index).call_text(), flush=True)
    rec = run_case(seed, index, args.device, True if args.known_issues else None)
    print(json.dumps(rec, indent=1))
    return 1 if rec["findings"] else 0


def _run(args: argparse.Namespace) -> int:
    from . import runner, sanitize

    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    cases = args.cases if args.cases is not None or args.minutes else 1000
    report_path = args.report or os.path.join(".tracea", "fuzz", f"ops-{seed}.json")
    cfg = runner.RunConfig(seed=seed, cases=cases, start=args.start, minutes=args.minutes, device=args.device,
                           jobs=args.jobs, timeout=args.timeout, known_issues=args.known_issues,
                           report=None, isolate_cache=not args.use_tuning_cache, quiet=args.quiet)
    what = f"{cases} cases" if cases is not None else "cases"
    print(f"tracea ops fuzzer: seed {seed}, {what}" + (f" for {args.minutes:g} min" if args.minutes else "")
          + f", device {args.device}, {args.jobs} job(s)", file=sys.stderr, flush=True)
    report = runner.run(cfg)
    code = 1 if report["findings"] or report["harness_errors"] else 0
    if args.sanitize:  # the cases' results first: a sanitizer phase cut short must not lose them
        runner.write_report(report, report_path)
        print(runner.summary_table(report))
        print(_findings_text(report), flush=True)
        indices = sanitize.sample(seed, [tuple(x) for x in report["ran"]], args.sanitize, args.device)
        report["sanitizer"] = sanitize.run(seed, indices, args.device, args.sanitizer_cmd or sanitize.SANITIZER_CMD,
                                           python=cfg.python, env={**os.environ, **cfg.env}, quiet=args.quiet,
                                           jobs=args.jobs)
        s = report["sanitizer"]
        print(f"sanitizer: {s['cases']} replays, {s['sanitizer_errors']} sanitizer errors, "
              f"{s['other_failures']} other failures, {s['timeouts']} timeouts", file=sys.stderr)
        if s["sanitizer_errors"] or s["other_failures"] or s["timeouts"]:
            code = 1
    runner.write_report(report, report_path)
    print(runner.summary_table(report))
    print(_findings_text(report))
    print(f"report: {report_path}  ({report['cases']} cases in {report['seconds']:.0f} s)")
    return code


def _findings_text(report: dict) -> str:
    lines = []
    if report["harness_errors"]:
        lines.append(f"{len(report['harness_errors'])} harness errors (bugs of the fuzzer), e.g. "
                     f"{report['harness_errors'][0]['seed']}:{report['harness_errors'][0]['index']}: "
                     f"{report['harness_errors'][0]['harness_error']}")
    seen: dict[tuple[str, str], int] = {}
    for f in report["findings"]:
        key = (f["category"], f["op"] + " " + f["backend"] + ": " + f["message"][:100])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            lines.append(f"[{f['category']}] {f['op']} on {f['backend']}: {f['message'][:160]}\n"
                         f"    {f['reproducer']}")
    if report["known"]:
        lines.append("known issues tolerated: " + ", ".join(f"{k} x{n}" for k, n in report["known"].items()))
    return "\n".join(lines) if lines else "no findings"


if __name__ == "__main__":
    sys.exit(main())
