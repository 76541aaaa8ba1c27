"""How the ``agentrt`` console script ends when interrupted (runtime_service/cli/entry.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from runtime_service.cli.entry import EXIT_INTERRUPTED, quiet_exits, sigint_deferred


@pytest.fixture(autouse=True)
def interruptible() -> Iterator[None]:
    """SIGINT as the command has it (``take_sigint``, which ``main`` calls first, makes it
    interrupt), whatever the test process got: a CI runner may start it with SIGINT ignored,
    and an ignored signal is ignored again when the block gives it back."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigint_inside_the_deferred_block_interrupts_only_after_it() -> None:
    """Raised inside a C extension's module set-up, the interrupt would come out as an
    ImportError; held, it is raised where the block ends, as the KeyboardInterrupt it is."""
    reached_the_end_of_the_block = False
    with pytest.raises(KeyboardInterrupt), sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        # Bytecodes run here that would have taken the interrupt were it not held.
        total = sum(range(10_000))
        reached_the_end_of_the_block = total > 0
    assert reached_the_end_of_the_block
    # The handler is what it was.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_during_the_command_is_a_quiet_130() -> None:
    def run() -> int:
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        return 0

    assert quiet_exits(run) == EXIT_INTERRUPTED


def test_a_sigint_the_process_ignores_stays_ignored() -> None:
    """Called in-process with SIGINT ignored (``main(argv)`` does not take it), the block
    gives the signal back to the ignoring disposition, which drops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
