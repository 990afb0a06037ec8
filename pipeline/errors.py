"""Errors with a message meant for the user (kept free of any library, so the training core is too)."""


class ConfigError(ValueError):
    """A params.yaml problem; the message names the key, the value and what is allowed."""
