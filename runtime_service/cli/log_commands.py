"""The registry log's commands: ``keys``, ``keygen``, ``checkpoint``, ``verify`` and ``card``.

``keys`` prints the server's verifier keys, one a line, the signing one first; ``checkpoint``
prints its current signed checkpoint, the note's exact bytes, so it can be piped to any C2SP
note verifier; ``verify REF`` proves a reference against the log with
:func:`agentrt_sdk.transparency.verify_version` (exit 1, one line naming what failed, when it
does not verify); ``card REF`` prints the version as a signed A2A Agent Card; ``keygen FILE``
writes a new signing key, no server needed.
docs/audit.md says what each proves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrt_core.signed_note import NoteError, Verifier
from agentrt_sdk import AgentrtClient
from agentrt_sdk.transparency import (
    LogState,
    VerificationError,
    default_state_path,
    verify_version,
)
from runtime_service.cli.client import (
    Body,
    Subparsers,
    add_target_argument,
    add_timeout_argument,
    guarded,
)
from runtime_service.cli.entry import EXIT_FAILED, EXIT_USAGE
from runtime_service.cli.errors import CommandFailed, fail, one_line

__all__ = ["KEY_HELP", "add_commands", "trusted_keys"]

KEY_HELP = (
    "a trusted verifier key (name+hash+base64, as 'agentrt keys' prints it), or a file holding"
    " them a line each; repeatable"
)


def add_commands(commands: Subparsers[argparse.ArgumentParser]) -> None:
    """Add ``keys``, ``keygen``, ``checkpoint`` and ``verify`` to the ``agentrt`` parser."""
    keys = commands.add_parser(
        "keys",
        help="print the server's signing keys (C2SP verifier keys), the signing one first",
        description="Print the keys the server signs with and has signed with, one C2SP "
        "verifier key (name+hash+base64) a line, the one signing now first.",
    )
    _client(keys, _keys)

    checkpoint = commands.add_parser(
        "checkpoint",
        help="print the registry log's current signed checkpoint, exactly as signed",
        description="Print the registry log's current checkpoint: the C2SP signed note, byte "
        "for byte (origin, size and root hash, a blank line, the signatures).",
    )
    _client(checkpoint, _checkpoint)

    verify = commands.add_parser(
        "verify",
        help="prove an agent version against the registry log (a rollback or a forked "
        "history fails)",
        description="Prove that REF's version is the one the registry log recorded: its "
        "content recomputes to its digest, the log holds it under a checkpoint signed by a "
        "trusted key, that checkpoint extends the last one this client saw, and for a tag, "
        "no later entry moved the tag. Exit 1 with what failed when it does not verify.",
    )
    verify.add_argument("ref", metavar="REF", help="coding_agent@agent_v7, …@sha256:…, agent:tag")
    verify.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"{KEY_HELP} (default: the keys pinned for this log in the state file; without"
        " any, the server's keys are pinned on first use)",
    )
    verify.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="FILE",
        help="where the last checkpoint seen and the pinned keys are kept (env "
        "AGENTRT_LOG_STATE; default ~/.local/state/agentrt/log-state.json)",
    )
    _client(verify, _verify)

    card = commands.add_parser(
        "card",
        help="print an agent version as an A2A Agent Card signed by the server (JSON)",
        description="Print the agent version REF names as an A2A Agent Card, with the "
        "server's JWS signature over its RFC 8785 form (docs/audit.md, 'Signed agent cards').",
    )
    card.add_argument("ref", metavar="REF", help="coding_agent@agent_v7, …@sha256:…, agent:tag")
    _client(card, _card)

    keygen = commands.add_parser(
        "keygen",
        help="write a new Ed25519 signing key for 'serve --signing-key' (no server needed)",
        description="Write a new Ed25519 private key (PKCS#8 PEM, readable by its owner only) "
        "to FILE for 'agentrt serve --signing-key FILE'; refuses to overwrite a file.",
    )
    keygen.add_argument("file", type=Path, metavar="FILE")
    keygen.set_defaults(handler=_keygen)


def _client(parser: argparse.ArgumentParser, body: Body) -> None:
    add_target_argument(parser)
    add_timeout_argument(parser)
    parser.set_defaults(handler=guarded(body))


async def _keys(client: AgentrtClient, args: argparse.Namespace) -> int:
    for key in await client.registry.signing_keys():
        print(key.verifier_key)
    return 0


async def _card(client: AgentrtClient, args: argparse.Namespace) -> int:
    response = await client.registry.agent_card(args.ref)
    print(json.dumps(json.loads(response.card), indent=2, ensure_ascii=False))
    return 0


async def _checkpoint(client: AgentrtClient, args: argparse.Namespace) -> int:
    checkpoint = await client.registry.checkpoint()
    sys.stdout.write(checkpoint.note)
    return 0


def trusted_keys(values: list[str]) -> list[Verifier]:
    """The keys ``--key`` names (each a verifier key or a file of them); a bad one is a
    usage error naming it."""
    keys: list[Verifier] = []
    for value in values:
        lines = [value]
        if "+" not in value or Path(value).is_file():
            try:
                lines = Path(value).read_text().split()
            except OSError as exc:
                raise CommandFailed(f"--key {value}: {exc.strerror or exc}", EXIT_USAGE) from None
        for line in lines:
            try:
                keys.append(Verifier.parse(line))
            except NoteError as exc:
                raise CommandFailed(f"--key {one_line(line)}: {exc}", EXIT_USAGE) from None
    return keys


async def _verify(client: AgentrtClient, args: argparse.Namespace) -> int:
    keys = trusted_keys(args.key)
    state = LogState.load(args.state or default_state_path())
    try:
        result = await verify_version(
            client.registry, args.ref, state, keys or None, target=client.target
        )
    except VerificationError as exc:
        raise CommandFailed(
            f"{args.ref}: NOT VERIFIED: {one_line(str(exc))}", EXIT_FAILED
        ) from None
    signed = result.checkpoint
    print(f"{args.ref}: verified {result.digest}")
    print(f"  log {signed.origin}, entry {result.entry_index} of {signed.size}")
    if result.tag_entry is not None:
        print(f"  tag set by entry {result.tag_entry}, not moved since")
    if result.previous_size is None:
        print("  first checkpoint seen for this log: kept for the next verify")
    else:
        print(f"  consistent with the checkpoint of {result.previous_size} seen before")
    if result.pinned_now:
        print("  keys pinned on first use (pass --key to trust a key from elsewhere)")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from agentrt_base.signing_keys import generate_key_file

    try:
        generate_key_file(args.file)
    except FileExistsError:
        return fail(f"{args.file} exists; a key is never overwritten", EXIT_USAGE)
    except OSError as exc:
        return fail(f"{args.file}: {exc.strerror or exc}", EXIT_FAILED)
    print(args.file)
    return 0
