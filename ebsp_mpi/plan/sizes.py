"""Memory sizes a person types: ``512MiB``, ``2GB``, ``100k bytes``, ``4096`` -> bytes.

One parser for every size option of the planner, so that ``--memory-limit 2GB`` means the same
everywhere: decimal prefixes are powers of 1000 (``k``, ``M``, ``G``, ``T``, as in ``kB``, ``MB``)
and binary ones powers of 1024 (``KiB``, ``MiB``, ``GiB``, ``TiB``); a bare number is bytes; ``B``,
``byte`` and ``bytes`` may follow, with or without a space. Pure standard library.
"""

from __future__ import annotations

import re

_PREFIX = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_SIZE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?P<prefix>[kmgt]?)(?P<binary>i?)\s*"
                   r"(?P<unit>b|bytes?)?\s*$", re.IGNORECASE)
UNITS = "B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"


def parse_size(text: str, what: str = "size") -> int:
    """Bytes that `text` names, rounded down to a whole byte.

    Raises
    ------
    ValueError
        One line naming `what` and `text`: not a size, ``i`` without a prefix (``iB``), or not
        positive.
    """
    m = _SIZE.match(str(text))
    if m is None or (m["binary"] and not m["prefix"]) or (m["binary"] and not m["unit"]):
        raise ValueError(f"{what} {text!r}: expected a size such as 512MiB, 2GB or 100000 (bytes); units: {UNITS}")
    base = 1024 if m["binary"] else 1000
    value = float(m["number"]) * base ** _PREFIX[m["prefix"].lower()]
    if not 1 <= value < 2**63:
        raise ValueError(f"{what} {text!r}: must be at least 1 byte and below 8 EiB")
    return int(value)


def format_size(nbytes: float) -> str:
    """``nbytes`` in binary units, e.g. ``"23.5 MiB"`` (whole bytes below 1 KiB)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
