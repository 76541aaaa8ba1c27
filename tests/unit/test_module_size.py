"""Modules of one concern: no module of the packages is longer than 600 lines without a reason.

A module past :data:`LIMIT` lines usually holds more than one concern, and a reader has to
find the seams a split would have shown (issue 28, item 6). One that should stay whole says
why, in its module docstring, on a line that starts with the marker :data:`MARKER`
("Kept whole:") followed by the reason, for example::

    \"\"\"The canonical form of registry objects.

    Kept whole: its three layers (JSON bytes, spec normalisation, documents) are short, and
    they are read together whenever the digest rules change.
    \"\"\"

The marker counts only inside the docstring (read with ``ast``, nothing is imported), not in
a comment, and only with a reason after it. Migrations are exempt: each is a frozen record of
one schema change, not a module anyone extends.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

PACKAGES = ("agentrt_base", "agentrt_core", "agentrt_sdk", "registry", "runtime_service")
ROOT = Path(__file__).resolve().parents[2]

LIMIT = 600
MARKER = "Kept whole:"
#: The shortest reason accepted after the marker: a few words, not a placeholder.
MIN_REASON = 20


def modules(root: Path, packages: Collection[str]) -> Iterator[Path]:
    """Every ``.py`` file of ``packages`` under ``root``, migrations left out."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.relative_to(root).parts:
                yield path


def has_reason(source: str) -> bool:
    """Whether the module docstring has a line starting with :data:`MARKER` and a reason."""
    try:
        docstring = ast.get_docstring(ast.parse(source))
    except SyntaxError:
        return False
    for line in (docstring or "").splitlines():
        line = line.strip()
        if line.startswith(MARKER) and len(line[len(MARKER) :].strip()) >= MIN_REASON:
            return True
    return False


def too_long(
    root: Path, packages: Collection[str], *, exempt: Collection[str] = frozenset()
) -> list[str]:
    """``path: N lines`` for every module over :data:`LIMIT` lines without a reason."""
    found = []
    for path in modules(root, packages):
        relative = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        count = len(source.splitlines())
        if count > LIMIT and relative not in exempt and not has_reason(source):
            found.append(f"{relative}: {count} lines")
    return found


def test_no_module_is_too_long_without_a_reason() -> None:
    found = too_long(ROOT, PACKAGES)
    assert not found, (
        f"modules over {LIMIT} lines: split them by concern, or say why one stays whole on "
        f"a line of its docstring starting {MARKER!r}:\n  " + "\n  ".join(found)
    )


# -- the checker itself, on a tree of its own --------------------------------------------------


def _module(docstring: str, lines: int) -> str:
    """A module of exactly ``lines`` lines with ``docstring``."""
    head = f'"""{docstring}"""\n'
    body = "".join(f"x{i} = {i}\n" for i in range(lines - len(head.splitlines())))
    return head + body


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


REASON = "its parts are read together, and a split would scatter one rule."


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        (_module("Short.", LIMIT), False),
        (_module("Long, with no reason.", LIMIT + 1), True),
        (_module(f"Long.\n\n{MARKER} {REASON}\n", LIMIT + 1), False),
        # The marker must start a line of the docstring...
        (_module(f"Long. Not {MARKER} {REASON}\n", LIMIT + 1), True),
        # ...and be followed by a reason, not left empty.
        (_module(f"Long.\n\n{MARKER}\n", LIMIT + 1), True),
        (_module(f"Long.\n\n{MARKER} tbd\n", LIMIT + 1), True),
        # A comment is not the docstring.
        (f"# {MARKER} {REASON}\n" + _module("Long.", LIMIT), True),
        # Nor is a string that is not the module's first statement.
        ("import os\n" + _module(f"{MARKER} {REASON}", LIMIT), True),
    ],
    ids=[
        "at-the-limit",
        "over-without-reason",
        "over-with-reason",
        "marker-mid-line",
        "marker-without-reason",
        "marker-with-placeholder",
        "marker-in-a-comment",
        "marker-in-a-later-string",
    ],
)
def test_the_checker_reports_a_long_module_without_a_reason(
    tmp_path: Path, source: str, reported: bool
) -> None:
    _write(tmp_path, {"agentrt_core/big.py": source})
    found = too_long(tmp_path, ("agentrt_core",))
    assert found == ([f"agentrt_core/big.py: {len(source.splitlines())} lines"] if reported else [])


def test_the_checker_skips_migrations_and_exempt_modules(tmp_path: Path) -> None:
    long = _module("Long.", LIMIT + 50)
    _write(
        tmp_path,
        {
            "runtime_service/migrations/versions/0001_init.py": long,
            "runtime_service/cli/operator.py": long,
            "runtime_service/server.py": long,
            "registry/store.py": long,
        },
    )
    found = too_long(
        tmp_path,
        ("runtime_service", "registry"),
        exempt={"runtime_service/cli/operator.py"},
    )
    assert found == [
        f"runtime_service/server.py: {LIMIT + 50} lines",
        f"registry/store.py: {LIMIT + 50} lines",
    ]
