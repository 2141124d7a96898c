"""The exception that leaves a candidate site unchanged."""


class Unsupported(Exception):
    """A site the passes leave unchanged; the message says why."""
