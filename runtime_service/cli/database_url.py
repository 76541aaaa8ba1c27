"""The database URL of ``agentrt serve`` and ``agentrt db upgrade``, and its password.

A URL given with ``--database-url`` is in the process's arguments, which every user of the
machine can read (``ps``, ``/proc/PID/cmdline``). The URL can come from
``AGENTRT_DATABASE_URL`` instead, and the password from a file
(``--database-password-file`` / ``AGENTRT_DATABASE_PASSWORD_FILE``) whose content replaces
the URL's password; a password on the command line still works, with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from agentrt_base.db_engines import normalise_url
from agentrt_base.db_failures import DatabaseUnavailable
from agentrt_base.settings import ENV_DATABASE_PASSWORD_FILE, ENV_DATABASE_URL

log = logging.getLogger("agentrt.cli")

PASSWORD_ON_COMMAND_LINE = (
    "the database password is in the command line, which other users of this machine can "
    f"read; set {ENV_DATABASE_URL} or use --database-password-file instead"
)


def password_file(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The password file to read: the flag, then the environment."""
    env = os.environ if environ is None else environ
    return flag or env.get(ENV_DATABASE_PASSWORD_FILE) or None


def with_password_from_file(url: str, path: str) -> str:
    """``url`` with its password replaced by the content of the file at ``path`` (one
    trailing line break dropped, as editors add one).

    Raises:
        DatabaseUnavailable: the file cannot be read or is empty, the URL is malformed or
            names SQLite (which has no password); one line, without the password.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        message = f"cannot read the database password file {path}: {reason}"
        raise DatabaseUnavailable(message) from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise DatabaseUnavailable(f"the database password file {path} is empty")
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        raise DatabaseUnavailable("a database password file is for PostgreSQL; SQLite has none")
    return parsed.set(password=password).render_as_string(hide_password=False)


def warn_if_password_in_arguments(flag_url: str | None) -> None:
    """One warning line when ``--database-url`` carries a password."""
    if not flag_url:
        return
    try:
        password = make_url(flag_url).password
    except (sa.exc.ArgumentError, ValueError):
        return  # not a URL: refused with its own line when the database is opened
    if password:
        log.warning(PASSWORD_ON_COMMAND_LINE)
