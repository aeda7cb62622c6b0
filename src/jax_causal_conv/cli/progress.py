"""Progress for long benchmark runs: a rich bar on a terminal, plain lines in a log.

On a terminal (the stream is a TTY and rich is installed; it comes with flax)
the bar redraws in place and the per-item lines are printed above it. In a
log (a file, a pipe, CI) every item is one line, flushed at once, prefixed
with the count, the elapsed time and an estimate of the time left, and there
are no carriage returns to pile up into one long line."""

from __future__ import annotations

import sys
import time


def _fmt_s(s):
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """``with Progress(total, "matrix") as p: ... p.step("one line about the item")``."""

    def __init__(self, total, desc="", stream=None, bar=None):
        self.total, self.desc, self.n = int(total), desc, 0
        self.stream = sys.stderr if stream is None else stream
        self.t0 = time.perf_counter()
        self._bar = None
        tty = getattr(self.stream, "isatty", lambda: False)()
        if bar is None:
            bar = tty
        if bar:
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                           TextColumn, TimeRemainingColumn)
            except ImportError:  # the plain lines below still work
                Bar = None
            if Bar is not None:
                self._bar = Bar(TextColumn(desc), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), console=Console(file=self.stream))
                self._task = self._bar.add_task(desc, total=self.total)
                self._bar.start()

    def log(self, line):
        """A line of output that is not a step (a note, a warning)."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def prefix(self):
        el = time.perf_counter() - self.t0
        left = el / self.n * (self.total - self.n) if self.n else 0.0
        return f"[{self.n}/{self.total} {_fmt_s(el)}, ~{_fmt_s(left)} left]"

    def step(self, line=None):
        """One item done; `line` describes it."""
        self.n += 1
        if self._bar is not None:
            if line:
                self._bar.console.print(line, markup=False, highlight=False)
            self._bar.advance(self._task)
        elif line:
            print(f"{self.prefix()} {line}", file=self.stream, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
