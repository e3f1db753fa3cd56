"""The base of errors a person fixes by changing the input (a job value, a dataset file, the backend).

The CLI prints them as one line and exits with code 2; anything else is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input: the message names what was given and what is allowed or expected."""
