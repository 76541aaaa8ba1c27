"""docs/api.md's command reference is what the parser says, to the character, and it names
every command, positional and flag the parser has (so the generator cannot skip one)."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime_service.cli import reference
from runtime_service.cli.main import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _section(text: str) -> str:
    start = text.index(reference.BEGIN)
    return text[start : text.index(reference.END) + len(reference.END)]


def test_the_doc_holds_the_generated_reference() -> None:
    generated = reference.generate()
    assert _section(DOC.read_text(encoding="utf-8")) == generated, (
        "docs/api.md's command reference is stale: run "
        "`python -m runtime_service.cli.reference --write`"
    )


def _leaves(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every leaf command, walked here independently of the generator."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _leaves(child, (*words, name)) or [((*words, name), child)]
    return found


def test_every_command_positional_and_flag_is_in_the_reference() -> None:
    parser = build_parser()
    leaves = _leaves(parser)
    assert len(leaves) >= 30  # serve ... watch: a walk that found nothing would pass below
    rows = {
        row.split("`")[1].split(" [")[0].split(" (")[0]: row
        for row in reference.generate(parser).splitlines()
        if row.startswith("| `agentrt ")
    }
    shared = {s for a in reference.client_flags() for s in a.option_strings}
    for words, command in leaves:
        prefix = " ".join(["agentrt", *words])
        matching = [
            row for key, row in rows.items() if key.startswith(prefix + " ") or key == prefix
        ]
        assert matching, f"{prefix} is missing from the reference"
        row = matching[0].replace("\\|", "|")
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                flag = max(action.option_strings, key=len)
                shown = flag in row or (flag in shared and "[client flags]" in row)
                assert shown, f"{prefix}: {flag} is missing from {row}"
            else:
                assert str(action.metavar or action.dest.upper()) in row, (prefix, action.dest)


def test_client_flags_are_folded_only_where_they_are_the_shared_ones() -> None:
    text = reference.generate()
    watch = next(line for line in text.splitlines() if line.startswith("| `agentrt watch "))
    assert "[client flags]" in watch and "--target" not in watch
    # health's --timeout has its own default: its flags are shown in full.
    health = next(line for line in text.splitlines() if line.startswith("| `agentrt health "))
    assert "[client flags]" not in health and "--target HOST:PORT" in health
    assert "- `--timeout SECONDS`: per call (default 30)" in text


def test_synopsis_forms() -> None:
    text = reference.generate()
    assert "| `agentrt send RUN [--json] (--steer TEXT \\| --follow-up TEXT) " in text
    assert "| `agentrt watch (RUN \\| --thread THREAD) " in text
    assert "[--scope S]…" in text  # repeatable
