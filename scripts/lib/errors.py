"""One error type for everything a user can get wrong; the CLI prints it and exits non-zero."""


class UserError(Exception):
    """A problem the user can fix. The message names the problem and the fix."""

    exit_code = 2


class Interrupted(UserError):
    """Ctrl-C stopped the work; the message says what was left as it was."""

    exit_code = 130


class ConflictError(UserError):
    """A patch did not apply; the tree has been put back as it was."""

    exit_code = 3
