"""Checking the shape of ``agentrt demo``'s audit tree (agentrt_sdk/demo/play.py), shared by
its unit test and the demo's end-to-end test."""

from __future__ import annotations

BRANCH, LAST = "├─ ", "└─ "


def _prefix(line: str) -> tuple[int, str]:
    """How deep ``line`` is (the 3-cell units before its text) and its glyph ('' for none)."""
    depth = 0
    while line[3 * depth : 3 * depth + 3] in ("│  ", "   "):
        depth += 1
    glyph = line[3 * depth : 3 * depth + 3]
    return depth, glyph if glyph in (BRANCH, LAST) else ""


def assert_tree(lines: list[str]) -> None:
    """At every level, the last child has ``└─`` and the others ``├─``; below a ``├─`` its
    details and children carry a ``│`` down to its next sibling, below a ``└─`` a space."""
    parsed = [_prefix(line) for line in lines]
    for i, (depth, glyph) in enumerate(parsed):
        if not glyph:
            continue
        sibling = False
        for j in range(i + 1, len(lines)):
            deeper, other = parsed[j]
            if deeper < depth or (deeper == depth and not other):
                break  # the parent's next line, or the text after the tree
            if deeper == depth:
                sibling = True
                break
            assert lines[j][3 * depth] == ("│" if glyph == BRANCH else " "), (i, j, lines)
        assert glyph == (BRANCH if sibling else LAST), (lines[i], "\n".join(lines))
