"""Which module may import which, read from the source with ``ast`` (nothing is imported).

Every import counts: absolute and relative, at the top, inside a function, under
``TYPE_CHECKING``. ``from pkg import name`` counts as an import of ``pkg`` and of
``pkg.name`` (``name`` may be a submodule: ``from runtime_service import servicers``). Imports
built at run time (``importlib.import_module``) are not seen; the packages have none.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Rule:
    """Modules matching any of ``modules`` (globs on dotted names) may not import a module whose
    dotted name starts with any of ``forbidden`` (plain string prefixes: ``agentrt.`` is the
    generated protobuf package and not ``agentrt_base``; ``agentrt_base.db`` also covers
    ``agentrt_base.db_engines`` and ``agentrt_base.db_failures``)."""

    modules: tuple[str, ...]
    forbidden: tuple[str, ...]
    reason: str
    #: Why the rule's modules may not exist yet (the rule applies as soon as they do); empty
    #: for a rule whose every glob must match a module today.
    pending: str = ""
    #: Exact names exempt from ``forbidden`` (``sqlalchemy.orm`` for the Session type).
    allowed: tuple[str, ...] = ()
    #: Exact module names ``modules`` matches that the rule does not cover (the reason says why).
    exempt: tuple[str, ...] = ()


#: What installs with the server or the command line (pyproject's ``server`` and ``cli``
#: extras) and so may not be needed by a client: ``pip install agentrt`` has none of them.
#: (cryptography is the client's too: it verifies what the server signed.)
SERVER_PACKAGES = ("sqlalchemy", "alembic", "psycopg", "jwt", "rich")

RULES = (
    Rule(
        ("agentrt_base", "agentrt_base.*"),
        ("registry", "runtime_service", "agentrt_sdk"),
        "the server's base sits under both services: runtime_service -> registry -> agentrt_base",
    ),
    Rule(
        ("registry", "registry.*"),
        ("runtime_service",),
        "the registry stands on its own; the runtime builds on it, never the reverse",
    ),
    Rule(
        (
            "runtime_service.step_process",
            "runtime_service.step_writer",
            "runtime_service.step_wire",
            "runtime_service.step_engine",
            "runtime_service.services",
            "runtime_service.services.*",
            "runtime_service.store",
            "runtime_service.store.*",
        ),
        ("runtime_service.servicers",),
        "transport stays on top: domain, storage and the step writer know nothing of servicers",
    ),
    Rule(
        ("runtime_service.store", "runtime_service.store.*"),
        ("runtime_service.services",),
        "storage sits under the domain",
    ),
    Rule(
        (
            "runtime_service.step_rules",
            "runtime_service.step_decide",
            "runtime_service.fence",
            "runtime_service.blob_rules",
            "runtime_service.records",
            "agentrt_core.completion",
        ),
        (
            "sqlalchemy",
            "grpc",
            "agentrt.",
            "asyncio",
            "runtime_service.store",
            "runtime_service.services",
            "agentrt_base.db",
            "agentrt_base.group_commit",
            "agentrt_base.raw",
        ),
        "the step and completion rules are pure: no database, transport, generated protobuf "
        "or event loop",
    ),
    Rule(
        ("runtime_service.services", "runtime_service.services.*"),
        ("sqlalchemy", "agentrt.", "grpc", "runtime_service.proto_map"),
        "services hold no SQL and build no protobuf: store/ holds the SQL, servicers the mapping",
        allowed=("sqlalchemy.orm", "sqlalchemy.orm.Session"),
    ),
    Rule(
        ("registry.service", "registry.service_*"),
        ("sqlalchemy", "agentrt.", "grpc", "agentrt_core.registry_map"),
        "the registry's use cases hold no SQL and build no protobuf, as the runtime's: "
        "registry/store.py holds the SQL, the servicer the mapping",
        allowed=("sqlalchemy.orm", "sqlalchemy.orm.Session"),
    ),
    Rule(
        ("runtime_service.proto_map",),
        ("sqlalchemy", "runtime_service.store", "runtime_service.services", "registry.store"),
        "the runtime's mapping to messages reads records (runtime_service.records), never rows",
    ),
    Rule(
        ("runtime_service.servicers", "runtime_service.servicers.*", "registry.servicer"),
        ("sqlalchemy", "runtime_service.store", "registry.store"),
        "servicers map requests to use cases and their answers to messages: they call services "
        "and never reach the storage underneath",
    ),
    Rule(
        ("agentrt_core", "agentrt_core.*"),
        (
            "agentrt_base",
            "registry",
            "runtime_service",
            "agentrt_sdk",
            *SERVER_PACKAGES,
        ),
        "the core is the rules client and server share: it stands under both and needs none of "
        "the server's packages",
    ),
    Rule(
        ("agentrt_sdk", "agentrt_sdk.*"),
        ("agentrt_base", "registry", "runtime_service", *SERVER_PACKAGES),
        "the SDK is a client: it calls the server over gRPC and shares only the core's pure "
        "rules (agentrt_core), never the server's packages, storage, services or transport",
    ),
    Rule(
        ("runtime_service.cli", "runtime_service.cli.*"),
        (
            "registry",
            "runtime_service.services",
            "runtime_service.store",
            "runtime_service.servicers",
            "sqlalchemy",
        ),
        "the client commands call the server through the SDK (AgentrtClient), never its "
        "registry, services, storage or servicers; serve, db and token run the server and "
        "open its database (server_commands, and database_url for their --database-url)",
        exempt=("runtime_service.cli.server_commands", "runtime_service.cli.database_url"),
    ),
)

PACKAGES = ("agentrt_base", "agentrt_core", "agentrt_sdk", "registry", "runtime_service")
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Import:
    path: str  # relative to the source root, as a reader opens it
    line: int
    importer: str  # the dotted name of the importing module
    #: What the statement may import, most general first: ``from a.b import c`` gives
    #: ``("a.b", "a.b.c")``.
    targets: tuple[str, ...]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    """Every import statement of the file at ``path``, wherever it sits in the file."""
    name = module_name(root, path)
    shown = path.relative_to(root).as_posix()
    # What a relative import is relative to: a package's own name, a module's package.
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=shown)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(shown, node.lineno, name, (alias.name,))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            named = [f"{source}.{alias.name}" for alias in node.names if alias.name != "*"]
            yield Import(shown, node.lineno, name, (source, *named))


def source_files(root: Path, packages: tuple[str, ...]) -> list[Path]:
    return sorted(path for package in packages for path in (root / package).rglob("*.py"))


def modules_of(root: Path, packages: tuple[str, ...]) -> set[str]:
    return {module_name(root, path) for path in source_files(root, packages)}


def violations(root: Path, packages: tuple[str, ...], rules: tuple[Rule, ...]) -> list[str]:
    """One line per import that breaks a rule: ``path:line: module imports X (rule: reason)``."""
    found = []
    for path in source_files(root, packages):
        for imp in imports_of(root, path):
            for rule in rules:
                if not any(fnmatch.fnmatchcase(imp.importer, glob) for glob in rule.modules):
                    continue
                if imp.importer in rule.exempt:
                    continue
                # The statement's source module is named when it alone is forbidden; otherwise
                # each forbidden name it takes from its package (``from pkg import a, b``).
                source, *names = imp.targets
                hits = [source] if _forbidden(source, rule) else []
                hits = hits or [target for target in names if _forbidden(target, rule)]
                found += [
                    f"{imp.path}:{imp.line}: {imp.importer} imports {hit} (rule: {rule.reason})"
                    for hit in hits
                ]
    return found


def _forbidden(target: str, rule: Rule) -> bool:
    return target.startswith(rule.forbidden) and target not in rule.allowed


def test_no_module_imports_what_its_layer_forbids() -> None:
    found = violations(ROOT, PACKAGES, RULES)
    assert not found, "imports that break the layering rules:\n" + "\n".join(found)


def test_every_rule_names_modules_that_exist() -> None:
    """A glob that matches nothing checks nothing (a typo, a module renamed or moved)."""
    modules = modules_of(ROOT, PACKAGES)
    unmatched = [
        glob
        for rule in RULES
        if not rule.pending
        for glob in rule.modules
        if not fnmatch.filter(modules, glob)
    ]
    assert not unmatched, f"rule globs that match no module: {unmatched}"
    # An exemption of a module that is gone would silently cover the next one of that name.
    stale = [name for rule in RULES for name in rule.exempt if name not in modules]
    assert not stale, f"exempt modules that do not exist: {stale}"


def test_every_rule_says_why() -> None:
    for rule in RULES:
        assert rule.reason and "\n" not in rule.reason, rule
        assert rule.modules and rule.forbidden, rule


def _tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_reports_a_violation_with_its_path_and_line(tmp_path: Path) -> None:
    """The checker run on a small tree of its own: one breach, buried in a function."""
    _tree(
        tmp_path,
        {
            "agentrt_base/__init__.py": "",
            "agentrt_base/clean.py": "import os\nfrom agentrt_base import errors\n",
            "agentrt_base/leaky.py": (
                '"""A module."""\n\nimport os\n\n\ndef f():\n    from registry.store import Tag\n'
            ),
            "registry/__init__.py": "",
            "registry/store.py": "from agentrt_base import clean\n",
        },
    )
    found = violations(tmp_path, ("agentrt_base", "registry"), RULES)
    assert found == [
        "agentrt_base/leaky.py:7: agentrt_base.leaky imports registry.store (rule: "
        f"{RULES[0].reason})"
    ]


@pytest.mark.parametrize(
    ("importer", "source", "line", "imported"),
    [
        # Relative, from a module: ``..`` is the package above the module's own.
        (
            "runtime_service/store/tables.py",
            "from ..services import runs",
            1,
            "runtime_service.services",
        ),
        # Relative, from a package's __init__: ``.`` is the package itself.
        (
            "runtime_service/store/__init__.py",
            "from . import x\nfrom ..servicers import y",
            2,
            "runtime_service.servicers",
        ),
        # A submodule taken by name from its package.
        (
            "runtime_service/step_process.py",
            "from runtime_service import servicers",
            1,
            "runtime_service.servicers",
        ),
        # Under TYPE_CHECKING.
        (
            "runtime_service/services/runs.py",
            "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    import runtime_service.servicers.worker",
            4,
            "runtime_service.servicers.worker",
        ),
        # A prefix covers the modules it begins: db_engines and db_failures are the database.
        (
            "runtime_service/step_rules.py",
            "from agentrt_base import db_failures",
            1,
            "agentrt_base.db_failures",
        ),
    ],
)
def test_the_checker_resolves_every_form_of_import(
    tmp_path: Path, importer: str, source: str, line: int, imported: str
) -> None:
    _tree(tmp_path, {importer: source + "\n"})
    found = violations(tmp_path, ("runtime_service",), RULES)
    assert len(found) == 1, found
    assert found[0].startswith(f"{importer}:{line}: "), found
    assert f" imports {imported} (rule: " in found[0], found


def test_a_prefix_is_not_a_lookalike(tmp_path: Path) -> None:
    """``agentrt.`` is the generated package: ``agentrt_base`` is not it."""
    _tree(
        tmp_path,
        {"runtime_service/step_rules.py": "from agentrt_core.errors import InvalidArgument\n"},
    )
    assert violations(tmp_path, ("runtime_service",), RULES) == []
    _tree(tmp_path, {"runtime_service/step_rules.py": "from agentrt.runtime.v1 import x\n"})
    assert len(violations(tmp_path, ("runtime_service",), RULES)) == 1


#: Top-level packages ``import agentrt_sdk`` (every module of it) may load besides the
#: standard library: the SDK, the core, the generated contract, gRPC and protobuf, and the
#: core's own dependencies (pyproject's base ``dependencies``, and what those load).
CLIENT_IMPORTS = frozenset(
    {
        "agentrt_sdk",
        "agentrt_core",
        "agentrt",
        "grpc",
        "google",
        "rfc8785",
        "jsonschema",
        "jsonschema_specifications",
        "referencing",
        "rpds",
        "attr",
        "attrs",
        "yaml",
        "typing_extensions",
        "idna",
        # Ed25519 checks of signed checkpoints (agentrt_core/signed_note.py), and what the
        # cryptography package loads.
        "cryptography",
        "_cffi_backend",
        "_openssl",
        # The OpenTelemetry API (agentrt_sdk/tracing.py: the worker joins the run's trace).
        "opentelemetry",
        # grpc's __init__ probes for these optional add-ons; a client-only install has none
        # (tests/e2e/test_client_install.py shows they are not installed there).
        "grpc_tools",
        "grpc_health",
        "grpc_reflection",
        "cython_runtime",  # made by Cython's extension modules (grpc's cygrpc) as they load
    }
)


def test_importing_the_sdk_loads_no_server_package() -> None:
    """The rules above read each file; this is what an import actually loads, transitively,
    in a fresh interpreter: every module of the SDK except the OpenAI adapter (behind the
    ``openai`` extra, imported on first use)."""
    script = (
        "import importlib, pkgutil, sys\n"
        "import agentrt_sdk\n"
        "for m in pkgutil.walk_packages(agentrt_sdk.__path__, 'agentrt_sdk.'):\n"
        "    if not m.name.endswith('openai_compat'):\n"
        "        importlib.import_module(m.name)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = {name for name in out if not name.startswith("_")} - sys.stdlib_module_names
    assert loaded <= CLIENT_IMPORTS, f"import agentrt_sdk loads {sorted(loaded - CLIENT_IMPORTS)}"


#: What the command line may load for a client command besides the client's packages: the
#: ``cli`` extra (rich, and what it loads) and the light parts of the server's base the parser
#: shows defaults from.
CLI_IMPORTS = CLIENT_IMPORTS | {
    "rich",
    "markdown_it",
    "mdurl",
    "pygments",
    "runtime_service",
    "agentrt_base",
}


def test_a_client_command_runs_without_the_server_packages() -> None:
    """``pip install 'agentrt[cli]'`` has no SQLAlchemy, PyJWT or psycopg: the
    parser (which lists serve, db and token too) must build and a client command must run
    with those packages absent. Run in a fresh interpreter where importing any of them fails,
    as it would there; the command talks to a port nobody listens on and must fail as a
    client does (exit 1, "cannot reach"), not on an import (exit 3)."""
    script = (
        "import importlib.abc, sys\n"
        f"BLOCKED = {tuple(p for p in SERVER_PACKAGES if p != 'rich')!r}\n"
        "class Absent(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Absent())\n"
        "from runtime_service.cli.entry import main\n"
        "code = main(['runs', 'list', '--target', '127.0.0.1:9', '--timeout', '2'])\n"
        "print('EXIT', code)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    lines = result.stdout.splitlines()
    assert len(lines) >= 2 and lines[-2] == "EXIT 1", result.stdout + result.stderr
    assert "cannot reach 127.0.0.1:9" in result.stderr, result.stderr
    loaded = {n for n in lines[-1].split() if not n.startswith("_")} - sys.stdlib_module_names
    assert loaded <= CLI_IMPORTS, f"a client command loads {sorted(loaded - CLI_IMPORTS)}"
