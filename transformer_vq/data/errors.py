"""The one exception type the data layer raises for problems a user can fix.

Every :class:`DataError` message names the problem *and* the fix (which file is missing and how
to get it, which option to change, ...). The command line catches it and prints the message
without a traceback, so the message is all the user sees: make it complete.
"""

from __future__ import annotations


class DataError(Exception):
    """A dataset could not be found, fetched, verified or parsed; the message says what to do."""
