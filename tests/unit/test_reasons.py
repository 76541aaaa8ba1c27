"""Every ErrorInfo reason is a constant of agentrt_core.reasons used at its raise sites, and
documented where a caller looks: in the proto comment of each RPC it names, or in the
"Errors" table of docs/api.md."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from agentrt_core import reasons
from tests import proto_comments

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agentrt_base", "agentrt_core", "registry", "runtime_service")
UPPER_SNAKE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")


def _python_files() -> Iterator[Path]:
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts and path.name != "reasons.py":
                yield path


def _literals(node: ast.expr | None) -> list[str]:
    """The UPPER_SNAKE string literals an expression can evaluate to (``"A" if c else "B"``
    included)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if UPPER_SNAKE.match(node.value) else []
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def literal_reasons() -> list[str]:
    """Every place the source passes or declares an error reason as a string literal: a
    ``reason=`` argument, or a ``reason`` class attribute."""
    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            values: list[ast.expr | None] = []
            if isinstance(node, ast.Call):
                values += [k.value for k in node.keywords if k.arg == "reason"]
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.Assign)
                        and any(
                            isinstance(t, ast.Name) and t.id == "reason" for t in statement.targets
                        )
                    ) or (
                        isinstance(statement, ast.AnnAssign)
                        and isinstance(statement.target, ast.Name)
                        and statement.target.id == "reason"
                    ):
                        values.append(statement.value)
            for value in values:
                for literal in _literals(value):
                    where = f"{path.relative_to(ROOT)}:{getattr(value, 'lineno', '?')}"
                    found.append(f"{where}: {literal}")
    return found


def test_the_scan_finds_a_literal_reason(tmp_path: Path) -> None:
    # The scanner itself, on a sample: what it must catch and what it must leave.
    sample = (
        "raise FailedPrecondition('x', reason='TURN_OPEN')\n"
        "raise Aborted('x', reason='A' if c else 'B_C')\n"
        "class E(AgentrtError):\n    reason = 'SOMETHING'\n"
        "record(reason='interrupted by a new run')\n"
        "raise FailedPrecondition('x', reason=reasons.TURN_OPEN)\n"
    )
    tree = ast.parse(sample)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    found = [
        lit
        for call in calls
        for k in call.keywords
        if k.arg == "reason"
        for lit in _literals(k.value)
    ]
    assert found == ["TURN_OPEN", "A", "B_C"]


def test_no_raise_site_passes_a_string_literal_reason() -> None:
    assert literal_reasons() == []


def test_each_constant_is_its_own_name_and_registered() -> None:
    constants = {
        name: value
        for name, value in vars(reasons).items()
        if UPPER_SNAKE.match(name) and isinstance(value, str)
    }
    assert constants == {name: name for name in reasons.REASONS}
    for reason in reasons.REASONS.values():
        assert reason.meaning and "\n" not in reason.meaning, reason


def test_every_reason_is_used_somewhere() -> None:
    source = "\n".join(path.read_text() for path in _python_files())
    unused = [name for name in reasons.REASONS if f"reasons.{name}" not in source]
    assert unused == []


def _api_errors_section() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    start = text.index("## Errors")
    return text[start : text.index("\n## ", start + 1)]


def test_every_reason_is_documented_where_its_rpcs_are() -> None:
    api = _api_errors_section()
    undocumented = []
    for reason in reasons.REASONS.values():
        if not reason.rpcs:
            if not re.search(rf"\b{reason.name}\b", api):
                undocumented.append(f"{reason.name}: docs/api.md, Errors")
            continue
        for name in reason.rpcs:
            method = proto_comments.rpc(name)
            # An RPC's comment, or its service's header (the errors common to its RPCs).
            text = method.comment + " " + proto_comments.service_of(method).comment
            if not re.search(rf"\b{reason.name}\b", text):
                undocumented.append(f"{reason.name}: {name} ({method.file})")
    assert undocumented == []
