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
    start : int
        Units done before this process began (a resumed run's): the rate and the ETA count only the
        units done since.
    counts : str, optional
        What the count is, after it (``"summed over 4 workers"``).
    samples_per_unit : int, optional
        Samples a unit trains on: shows samples/s.
    stop_seconds : float
        The run's time limit (0: none), for the ETA of a run that stops at a time.
    clock_start : float
        The run's clock when this process began (a resumed run's goes on from its checkpoint).
    """

    def __init__(self, total: int | None, unit: str = "it", stream=None, enabled: bool = True,
                 log_every_s: float = 5.0, start: int = 0, counts: str | None = None,
                 samples_per_unit: int | None = None, stop_seconds: float = 0.0, clock_start: float = 0.0):
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.1 if self.tty else log_every_s
        self.start, self.counts, self.samples_per_unit = start, counts, samples_per_unit
        self.stop_seconds, self.clock_start = stop_seconds, clock_start
        self.t0 = time.monotonic()
        self._last = -float("inf")
        self._written: str | None = None  # the last plain line, to not write the final one twice

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
        self._write(done, fields, time.monotonic(), final=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, done: int, fields: dict, now: float, final: bool = False) -> None:
        text, frac = self.line(done, fields, now - self.t0, final)
        if self.tty:
            bar = "" if frac is None else "[" + "#" * int(frac * 24) + "." * (24 - int(frac * 24)) + "] "
            self.stream.write("\r" + bar + text + "\x1b[K")
        else:
            # a log's last line already at `done` (its update came at the last unit): not again
            count = text.split("  ", 1)[0]
            if final and self._written == count:
                return
            self._written = count
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, done: int, fields: dict, elapsed: float, final: bool = False) -> tuple[str, float | None]:
        """The text for `done` units `elapsed` seconds after this process began, and the fraction done
        (None without a total)."""
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        counts = f" {self.counts}" if self.counts else ""
        if self.total:
            frac = min(1.0, done / self.total)
            count = f"{done}/{self.total} {self.unit}{counts} ({frac:4.0%})"
        else:
            frac, count = None, f"{done} {self.unit}{counts}"
        parts = [count, f"{elapsed:6.1f} s", f"{rate:7.1f} {self.unit}/s"]
        if self.samples_per_unit:
            parts.append(f"{rate * self.samples_per_unit:.0f} samples/s")
        left = []  # seconds to each limit: the first one reached ends the run
        if self.total and rate > 0 and done < self.total:
            left.append((self.total - done) / rate)
        if self.stop_seconds > 0:
            left.append(max(0.0, self.stop_seconds - self.clock_start - elapsed))
        if left and not final:
            parts.append(f"ETA {_duration(min(left))}")
        parts += [f"{k} {_fmt(v)}" for k, v in fields.items() if v is not None]
        return "  ".join(parts), frac


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
