"""The errors a person acts on, printed as one line without a traceback.

- :class:`UsageError`: bad input (a job value, a dataset file, the backend, an output path); the CLI
  exits with code 2.
- :class:`OutputError`: the run's outputs cannot be written (a full disk, a quota, a file system gone
  read-only); exit code 1, and no half-written file is left behind.

Anything else is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input: the message names what was given and what is allowed or expected."""


class OutputError(RuntimeError):
    """A run's output (summary, model, trace) could not be written; the message names the file."""
