"""The one exception type of the data layer."""

from ..errors import UsageError


class DatasetError(UsageError, ValueError):
    """A dataset could not be loaded or a sharding request is impossible.

    The message names the path (or the argument) and what was expected, so a
    person can fix the file or the job without reading the code.
    """
