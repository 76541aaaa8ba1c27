"""How every ``agentrt`` command reports a failure: one ``agentrt: …`` line on stderr and an
exit code from the one table (:mod:`runtime_service.cli.entry`).

A refusal from the server arrives as the SDK's typed error (:mod:`agentrt_sdk.errors`, which
decodes the ``google.rpc`` details once for every client); :func:`report` is the only place
that turns one into words. A failure the command finds itself (a bad file, an expectation
the answer does not meet) is a :class:`CommandFailed` carrying its own exit code.
"""

from __future__ import annotations

import sys

from agentrt_sdk import AgentrtError, UnavailableError
from runtime_service.cli.entry import EXIT_FAILED

__all__ = ["CommandFailed", "describe", "fail", "one_line", "report"]


class CommandFailed(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces: a server's or a
    user's text must not break the one-line report."""
    return " ".join(text.split())


def fail(message: str, code: int) -> int:
    """Print ``agentrt: MESSAGE`` (on one line) to stderr and return ``code``."""
    print(f"agentrt: {one_line(message)}", file=sys.stderr)
    return code


def describe(error: AgentrtError, target: str) -> str:
    """``CODE: message [REASON]`` for a refused call (the report's line without its prefix).

    UNAVAILABLE names the address that was dialled (``cannot reach HOST:PORT``; the SDK has
    already added the hint for a plaintext client of a TLS server to the message). Digests
    the server put in ``ErrorInfo`` metadata but not in its message (``existing_digest``)
    are added, so a script can read what holds a taken label.
    """
    if isinstance(error, UnavailableError):
        return f"{error.code.name}: cannot reach {target}: {one_line(error.message)}"
    line = error.line()
    for key, value in sorted(error.metadata.items()):
        if key.endswith("_digest") and value and value not in line:
            line += f" ({key.replace('_', ' ')}: {value})"
    return line


def report(error: AgentrtError, target: str) -> int:
    """Report a refused call: :func:`describe`'s line, then one indented line per field
    violation the line does not already state (the server's message names the first one, so
    a request with one bad field is reported on one line); returns :data:`EXIT_FAILED`."""
    line = describe(error, target)
    fail(line, EXIT_FAILED)
    for violation in error.field_violations:
        text = one_line(f"{violation.field}: {violation.description}")
        if text not in line:
            print(f"agentrt:   {text}", file=sys.stderr)
    return EXIT_FAILED
