"""The ``agentrt`` console script: how a command ends when it is interrupted or its reader
goes away, whatever the command.

This module imports nothing heavy, so that the command's own import (about a second: gRPC,
SQLAlchemy, rich) runs inside :func:`main`'s ``try``, with SIGINT held until it is done:
Ctrl-C during it is the same quiet exit 130 as Ctrl-C later, not a traceback out of an
import.

Exit codes of every command (docs/api.md, "Exit codes"): 130 = interrupted (SIGINT, Ctrl-C),
as a shell reports a command SIGINT ended; 141 = its standard output was closed by the
reader (``agentrt audit RUN | head -3``), as a shell reports a command SIGPIPE ended. Neither
prints anything.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

# Every command's exit codes, in one table (docs/api.md, "Exit codes"); 0: it did its work.
#: The command failed: a refusal, an unreachable server, a check that did not pass.
EXIT_FAILED = 1
#: Bad usage: argparse's own, and no command at all.
EXIT_USAGE = 2
#: The command cannot start: a database it cannot open, a port in use, a missing extra.
EXIT_CANNOT_START = 3
#: Ctrl-C (SIGINT): 128 + 2.
EXIT_INTERRUPTED = 130
#: Standard output closed by its reader (SIGPIPE): 128 + 13.
EXIT_BROKEN_PIPE = 141

#: The extra that installs each package the command line imports (pyproject.toml): a client
#: installed alone (`pip install agentrt`) has none of them.
_EXTRA_OF = {
    "rich": "cli",
    "sqlalchemy": "server",
    "alembic": "server",
    "psycopg": "server",
    "jwt": "server",
    "cryptography": "server",
    "grpc_health": "server",
    "grpc_reflection": "server",
    "openai": "openai",
}


def take_sigint() -> None:
    """Let SIGINT interrupt the command even when it was started with SIGINT ignored.

    Started by `nohup … &` or a CI runner, SIGINT arrives ignored; Ctrl-C and `kill -INT`
    must still stop a watch or a server (issue 26, item 5). Done before the command's import,
    so a SIGINT during it is not lost either.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block until it ends, then let it interrupt.

    A KeyboardInterrupt raised while a C extension initialises its module does not come out
    as a KeyboardInterrupt: Cython's module set-up reports it as an ImportError ("Failed to
    import 'zlib.decompress' - cannot initialise module strings", seen when grpc's cygrpc
    was interrupted), which would end the command with a traceback and exit 1. Inside the
    block the signal's Python handler only notes it; at the end the handler in place before
    is put back and, if the signal came, the signal is raised again for it, at a bytecode
    where :func:`quiet_exits` turns the interrupt into 130. (A handler, not the thread's
    signal mask: the kernel gives a process's signal to any thread that does not block it.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and only it receives the interrupt
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _frame: came.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if came:
            signal.raise_signal(signal.SIGINT)


def silence_stdout() -> None:
    """Point standard output at /dev/null, after a write to it failed with a broken pipe.

    The interpreter flushes ``sys.stdout`` once more as it exits; to the closed pipe that
    fails again and prints "Exception ignored ... BrokenPipeError" (the Python docs' note on
    SIGPIPE, in the ``signal`` module's documentation).
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's captured stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def quiet_exits(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or :data:`EXIT_INTERRUPTED` / :data:`EXIT_BROKEN_PIPE`
    without a traceback when it is interrupted or its standard output is closed."""
    try:
        code = run()
        # What is still buffered goes out here, inside the guard: the interpreter's own
        # flush at exit would report a closed pipe as "Exception ignored" and exit 120.
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentrt`` console script (``pyproject.toml``)."""
    if argv is None:  # the process is the command's own
        take_sigint()

    def run() -> int:
        try:
            with sigint_deferred():
                from runtime_service.cli import main as cli
        except ModuleNotFoundError as missing:
            extra = _EXTRA_OF.get((missing.name or "").split(".")[0])
            if extra is None:
                raise
            print(
                f"agentrt: the command line needs the {missing.name!r} package, which this"
                f" installation lacks: pip install 'agentrt[{extra}]'",
                file=sys.stderr,
            )
            return EXIT_CANNOT_START
        return cli.main(argv)

    return quiet_exits(run)


if __name__ == "__main__":
    sys.exit(main())
