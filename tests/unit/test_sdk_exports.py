"""The SDK's public surface (issue 28, item 1), checked the way httpx checks its own: every
public name the package holds is in ``__all__``, sorted, and nothing else; importing it loads
none of the server's packages; its types ship (``py.typed``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import agentrt_sdk


def test_all_public_names_are_exported_and_sorted() -> None:
    public = [name for name in vars(agentrt_sdk) if not name.startswith("_")]
    # Submodules the imports above bring in are attributes too; they are not exports.
    modules = {name for name in public if type(getattr(agentrt_sdk, name)).__name__ == "module"}
    assert agentrt_sdk.__all__ == sorted(set(public) - modules, key=str.casefold)
    for name in ("Client", "AgentrtClient", "Worker", "Attempt", "Result", "AgentrtError"):
        assert name in agentrt_sdk.__all__


def test_importing_the_sdk_loads_none_of_the_servers_packages() -> None:
    probe = (
        "import sys, agentrt_sdk, agentrt_sdk.worker, agentrt_sdk.models\n"
        # (Not grpc_health: grpc's own __init__ imports it whenever it is installed.)
        "heavy = ('sqlalchemy', 'alembic', 'psycopg', 'rich', 'openai', 'jwt', 'cryptography')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_the_sdk_ships_its_types() -> None:
    assert (Path(agentrt_sdk.__file__).parent / "py.typed").is_file()
