"""Plain text for ``--help``: module docstrings are reST (double back-quotes, ``:func:`` roles), which a
terminal shows verbatim, so the CLI strips that markup before argparse prints a docstring."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")


def plain(text: str | None) -> str:
    """``text`` with reST roles reduced to their target's name and double back-quotes removed."""
    if not text:
        return ""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(1).startswith(("tracea.", "~")) else m.group(1), text)
    return _LITERAL.sub(r"\1", text)
