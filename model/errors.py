"""Errors a user can cause and fix. Faces print them as one line, never a traceback."""


class UserError(Exception):
    """Bad input from the user: shown as a one-line message."""


class ModelLoadError(UserError):
    """A model spec, file or directory that cannot be loaded."""
