"""Progress of a long run: a one-line bar on a terminal, plain periodic lines in a log file.

A batch job's log should not fill with carriage returns, so when the stream is not a terminal the
reporter prints one complete line every ``log_every_s`` seconds instead of redrawing a bar.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Report ``done`` of ``total`` units (total may be None when only a time limit is known).

    Parameters
    ----------
    total : int or None
        Units of work expected (iterations); None shows a count without a bar.
    unit : str
        What a unit is, for the text (``"it"``).
    stream : file, optional
        Where to write (default ``sys.stderr``).
    enabled : bool
        False silences it (``--quiet``).
    log_every_s : float
        Seconds between plain lines when `stream` is not a terminal.
    """

    def __init__(self, total: int | None, unit: str = "it", stream=None, enabled: bool = True,
                 log_every_s: float = 5.0):
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.1 if self.tty else log_every_s
        self.t0 = time.monotonic()
        self._last = -float("inf")
        self._drawn = False

    def update(self, done: int, **fields) -> None:
        """Show progress now if enough time passed since the last report; `fields` are appended."""
        now = time.monotonic()
        if not self.enabled or now - self._last < self.interval:
            return
        self._last = now
        self._write(done, fields, now)

    def close(self, done: int, **fields) -> None:
        """Show the final state and end the line."""
        if not self.enabled:
            return
        self._write(done, fields, time.monotonic())
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, done: int, fields: dict, now: float) -> None:
        elapsed = now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        extra = "  ".join(f"{k} {_fmt(v)}" for k, v in fields.items() if v is not None)
        if self.total:
            frac = min(1.0, done / self.total)
            count = f"{done}/{self.total} {self.unit} ({frac:4.0%})"
        else:
            frac, count = None, f"{done} {self.unit}"
        text = f"{count}  {elapsed:6.1f} s  {rate:7.1f} {self.unit}/s  {extra}".rstrip()
        if self.tty:
            bar = "" if frac is None else "[" + "#" * int(frac * 24) + "." * (24 - int(frac * 24)) + "] "
            self.stream.write("\r" + bar + text + "\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
