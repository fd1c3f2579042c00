"""``tracea cache ls|show|clear|export|import``: inspect and manage the tuning cache."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from typing import Any

from ..errors import TraceaError
from .rst import plain
from .table import aligned


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cache", help="inspect and manage the tuning cache", description=plain(__doc__))
    p.add_argument("--cache", metavar="FILE", default=None,
                   help="cache file (default: TRACEA_CACHE_PATH or ./.tracea/tuning_cache.json)")
    sub = p.add_subparsers(dest="cache_cmd", metavar="{ls,show,clear,export,import}")
    ls = sub.add_parser("ls", help="list entries")
    ls.add_argument("--op", default=None, help="only ops whose key contains this text (e.g. gemm, m=1024)")
    ls.add_argument("--variant", default=None, help="only this variant (substring)")
    ls.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="show entries in full")
    show.add_argument("which", help="an index from 'ls' or text contained in the entry key")
    show.add_argument("--json", action="store_true")
    clear = sub.add_parser("clear", help="delete entries (all, or those matching the filters)")
    clear.add_argument("--op", default=None)
    clear.add_argument("--variant", default=None)
    clear.add_argument("--stale", action="store_true", help="only entries not valid in this environment")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    exp = sub.add_parser("export", help="write entries to another cache file")
    exp.add_argument("path")
    exp.add_argument("--op", default=None)
    exp.add_argument("--variant", default=None)
    imp = sub.add_parser("import", help="merge entries from another cache file")
    imp.add_argument("path")
    imp.add_argument("--replace", action="store_true", help="replace entries that exist in both")
    for sp in (ls, show, clear, exp, imp):
        sp.set_defaults(func=run)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..tuning.cache import TuningCache, get_cache

    cache = TuningCache(args.cache) if getattr(args, "cache", None) else get_cache()
    cmd = getattr(args, "cache_cmd", None) or "ls"
    try:
        if cmd == "ls":
            return _ls(cache, args)
        if cmd == "show":
            return _show(cache, args)
        if cmd == "clear":
            return _clear(cache, args)
        if cmd == "export":
            n = cache.export(args.path, _select(cache, args))
            print(f"exported {n} entr{'y' if n == 1 else 'ies'} to {args.path}")
            return 0
        if cmd == "import":
            n = cache.import_file(args.path, replace=args.replace)
            print(f"imported {n} entr{'y' if n == 1 else 'ies'} from {args.path} into {cache.path}")
            return 0
    except (TraceaError, OSError) as exc:
        print(f"tracea cache {cmd}: {exc}", file=sys.stderr)
        return 2
    return 2


def _select(cache: Any, args: argparse.Namespace) -> list[Any]:
    out = []
    for e in cache.entries():
        if getattr(args, "op", None) and args.op not in e.op_key:
            continue
        if getattr(args, "variant", None) and args.variant not in e.variant:
            continue
        out.append(e)
    return out


def validity(cache: Any, entry: Any) -> str:
    """``current`` when the entry's fingerprint matches this environment, ``stale`` when not, ``?``
    when its variant or device is not available here, ``invalid`` when it matches but dispatch
    ignores it (see :mod:`tracea.doctor.cached_config`)."""
    return entry_status(cache, entry)[0]


def entry_status(cache: Any, entry: Any) -> tuple[str, str]:
    """(:func:`validity`, why it is ``invalid``; empty otherwise)."""
    try:
        from ..doctor.cached_config import doctor_entry_problem
        from ..doctor.doctor import get_doctor
        from ..ir.device import Device
        from ..ir.ops import op_from_dict

        variant = cache._variant_obj(entry.variant)
        if variant is None:
            return "?", ""
        doctor = get_doctor()
        profile = doctor.profile_for(Device.parse(entry.device or "cpu"))
        op = op_from_dict(dict(entry.op))
        fp, _ = cache.fingerprint(variant, op, profile)
        if fp != entry.fingerprint:
            return "stale", ""
        why = doctor_entry_problem(doctor, entry, variant, op, profile)
        return ("invalid", why) if why else ("current", "")
    except Exception:  # noqa: BLE001 - the listing must work without backends or a Doctor
        return "?", ""


def _describe(entry: Any) -> str:
    from ..ir.ops import op_from_dict
    from ..usertune import store

    if store.is_user_entry(entry):
        return store.describe_entry(entry)
    try:
        return op_from_dict(dict(entry.op)).describe()
    except Exception:  # noqa: BLE001
        return str(entry.op_key)


def _us(seconds: Any, digits: int = 2) -> str:
    """Seconds as microseconds, or ``?(value)`` for a value that is not a sensible time."""
    try:
        if math.isfinite(seconds) and 0 <= seconds < 1e9:
            return f"{seconds * 1e6:.{digits}f} us"
    except TypeError:
        pass
    return f"?({seconds!r})"


def _when(stamp: Any) -> str:
    """A UTC date for a POSIX timestamp, or ``?(value)`` for one no calendar holds."""
    try:
        return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError, TypeError):
        return f"?({stamp!r})"


def _clip(text: Any, width: int = 120) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."


def _row(i: int, cache: Any, e: Any) -> tuple[str, ...]:
    try:
        from ..usertune import store

        user = store.is_user_entry(e)
        status = store.entry_status(e) if user else entry_status(cache, e)[0]
        return (str(i), _clip(_describe(e), 60), _clip(e.variant, 40), str(e.goal.value),
                _clip(f"{e.device} {e.device_name}", 28), _us(e.median_s), str(e.trials), status,
                _when(e.tuned_at), _clip(store.config_text(e) if user else e.config.key))
    except Exception as exc:  # noqa: BLE001 - show the rest of the cache whatever one entry holds
        return (str(i), _clip(getattr(e, "op_key", "?"), 60), "?", "?", "?", "?", "?",
                f"unreadable ({type(exc).__name__})", "?", "?")


def _ls(cache: Any, args: argparse.Namespace) -> int:
    entries = _select(cache, args)
    if args.json:
        print(json.dumps([_json(cache, e, index=i) for i, e in enumerate(entries)], indent=1))
        return 0
    if not entries:
        print(f"no entries in {cache.path}")
        return 0
    rows = [("#", "op", "variant", "goal", "device", "median", "trials", "status", "tuned", "config")]
    rows += [_row(i, cache, e) for i, e in enumerate(entries)]  # type: ignore[misc]
    print("\n".join(aligned(rows)))
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {cache.path}")
    return 0


def _json(cache: Any, e: Any, **extra: Any) -> dict[str, Any]:
    status, why = entry_status(cache, e)
    out = dict(e.to_json(), key=e.key, status=status, **extra)
    if why:
        out["invalid_reason"] = why
    return out


def _show(cache: Any, args: argparse.Namespace) -> int:
    entries = cache.entries()
    which = str(args.which)
    index = int(which) if which.isdecimal() and which.isascii() and len(which) < 10 else None
    chosen = [entries[index]] if index is not None and index < len(entries) else \
        [e for e in entries if which in e.key]
    if not chosen:
        print(f"no entry matches {_clip(which)!r} (see 'tracea cache ls')", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([_json(cache, e) for e in chosen], indent=1))
        return 0
    for e in chosen:
        status, why = entry_status(cache, e)
        print(f"{_describe(e)}  [{e.variant}]")
        print(f"  key          {e.key}")
        print(f"  status       {status} (fingerprint {e.fingerprint})" + (f": {why}" if why else ""))
        print(f"  goal         {e.goal.name}: score {_us(e.score_s, 3)}")
        print(f"  median/p90   {_us(e.median_s, 3)} / {_us(e.p90_s, 3)}, cv {e.cv:.3f}, {e.trials} trials")
        print(f"  config       {e.config.key}")
        print(f"  device       {e.device} {e.device_name}")
        print(f"  tuned        {_when(e.tuned_at)}")
        for k, v in sorted(e.env.items(), key=lambda kv: str(kv[0])):
            print(f"  env.{k:<9} {_clip(v, 200)}")
    return 0


def _clear(cache: Any, args: argparse.Namespace) -> int:
    chosen = _select(cache, args)
    if args.stale:
        chosen = [e for e in chosen if validity(cache, e) == "stale"]
    if not chosen:
        print("nothing to delete")
        return 0
    if not args.yes and sys.stdin.isatty():
        answer = input(f"delete {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} from {cache.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    keys = {e.key for e in chosen}
    n = cache.remove(lambda e: e.key in keys)
    print(f"deleted {n} entr{'y' if n == 1 else 'ies'} from {cache.path}")
    return 0
