"""The one exception type for problems a user can fix.

A ``UserError`` message names the input that is wrong, what is wrong with it, and what to do.
CLIs turn it into ``error: <message>`` on stderr and exit code 2, without a traceback.
It subclasses ``ValueError`` so library callers can catch it as the usual bad-value error.
"""


class UserError(ValueError):
    """Bad input that the user can fix; the message says which input and how."""
