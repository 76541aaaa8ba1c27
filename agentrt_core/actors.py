"""How a recorded actor reads: the one rule for every message and listing that names who did
something (an approver, a worker, a publisher), on the server and in the command line."""

from __future__ import annotations


def display_actor(principal: str, label: str) -> str:
    """How a recorded actor reads in a message or a listing: the principal, with the label
    the caller gave beside it when the label says something else (a label is never taken
    for the identity). A record from before principals were recorded has only its label,
    and says so."""
    if not principal:
        return f"{label or '-'} (label only, no principal recorded)"
    if label and label != principal:
        return f"{principal} (label {label!r})"
    return principal
