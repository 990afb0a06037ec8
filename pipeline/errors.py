"""Errors with a message meant for the user (kept free of any library, so the training core is too)."""


class UserError(Exception):
    """Caused by the user's params or files: a stage shows the message alone (no traceback) and exits 2.
    The errors of each stage's inputs subclass it, so the stage CLI needs none of their modules."""


class ConfigError(UserError, ValueError):
    """A params.yaml problem; the message names the key, the value and what is allowed."""


class ResultsError(UserError):
    """A results file (pipeline/results/store.py) is damaged, not a results file, or does not hold what it
    should; the message is one line naming the file and what rebuilds it."""

    def __init__(self, message: str, path=None, why: str = ""):
        super().__init__(message)
        self.path = path  # the file (a pathlib.Path), when there is one
        self.why = why  # the underlying reason, one line


class InputFileError(UserError, ValueError):
    """A stage's input file (partition, hashes) is damaged or not what it should be; the message
    names the file and the command that rebuilds it."""
