"""The comments of the contract's protos (protos/agentrt/*/v1/*.proto), read as a reader of
generated code reads them: each RPC's, each service's header, and each message's and field's.
Used by the tests that hold the comments to the behaviour."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ROOT / "protos"


@dataclass(frozen=True)
class Commented:
    """One commented element: ``file`` (relative to protos/), ``kind`` (``service``, ``rpc``,
    ``message``, ``field``, ``enum``, ``value``), its full ``name`` (``Service.Method``,
    ``Message.field``) and its comment as one line of text."""

    file: str
    kind: str
    name: str
    comment: str
    package: str

    @property
    def full_name(self) -> str:
        return f"{self.package}.{self.name}"


_DECLARATION = re.compile(
    r"^\s*(?:(service|message|enum)\s+(\w+)"
    r"|rpc\s+(\w+)\s*\("
    r"|(?:repeated\s+|optional\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+"
    r"|(\w+)\s*=\s*\d+\s*;)"
)


@cache
def elements() -> tuple[Commented, ...]:
    found: list[Commented] = []
    for path in sorted(PROTOS.glob("agentrt/*/v1/*.proto")):
        file = str(path.relative_to(PROTOS))
        package = ""
        comment: list[str] = []
        scopes: list[tuple[str, str]] = []  # (kind, name) of the enclosing blocks
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("package "):
                package = stripped.removeprefix("package ").rstrip(";")
            if stripped.startswith("//"):
                comment.append(stripped[2:].strip())
                continue
            match = _DECLARATION.match(line)
            if match and not stripped.startswith(("oneof", "option", "syntax", "import")):
                block, block_name, rpc, field, value = match.groups()
                parent = scopes[-1][1] if scopes else ""
                if block:
                    kind, name = block, block_name
                elif rpc:
                    kind, name = "rpc", f"{parent}.{rpc}"
                elif field and scopes and scopes[-1][0] == "message":
                    kind, name = "field", f"{parent}.{field}"
                else:
                    kind, name = "value", f"{parent}.{value or field}"
                text = " ".join(c for c in comment if c)
                found.append(Commented(file, kind, name, text, package))
                if block:
                    scopes.append((block, block_name if not parent else f"{parent}.{block_name}"))
            if stripped.startswith("oneof"):
                scopes.append(("oneof", scopes[-1][1] if scopes else ""))
            if stripped and not stripped.startswith("//"):
                comment = []
            opened = line.count("{") - line.count("}")
            if opened < 0 and "}" in stripped and not (match and match.group(1)):
                for _ in range(-opened):
                    if scopes:
                        scopes.pop()
    return tuple(found)


def rpc(full_name: str) -> Commented:
    """An RPC by ``package.Service.Method``."""
    [found] = [e for e in elements() if e.kind == "rpc" and e.full_name == full_name]
    return found


def service_of(method: Commented) -> Commented:
    service = method.name.partition(".")[0]
    [found] = [
        e
        for e in elements()
        if e.kind == "service" and e.name == service and e.package == method.package
    ]
    return found


def sentences(text: str) -> list[str]:
    """A comment cut into sentences (at a full stop, or a semicolon, followed by a space and
    a capital, or at the end)."""
    return [s.strip() for s in re.split(r"(?<=\.)\s+(?=[A-Z`(])", text) if s.strip()]
