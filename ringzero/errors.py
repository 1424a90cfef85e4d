"""Errors that reach the user as one clear message instead of a traceback.

Anything raised as a ``RingzeroError`` (or subclass) is bad input or a refused operation:
the CLI prints ``error: <message>`` and exits with status 2. Everything else is a bug.
"""


class RingzeroError(Exception):
    """Bad input or a refused operation; the message names what is wrong and where."""


class ConfigError(RingzeroError):
    """A run configuration failed validation; ``problems`` lists every field at fault."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"{source}: {len(self.problems)} {noun}\n{lines}")


class StoreError(RingzeroError):
    """A checkpoint store operation failed or found data it must not trust."""


class IntegrityError(StoreError):
    """A stored file does not match its manifest (size or sha256)."""


class ServerUnreachable(RingzeroError):
    """The server did not answer (refused or reset connection, timeout) or answered 5xx after every retry:
    a replica that is gone or restarting, as opposed to one that refused a request."""
