"""One root for the errors ``cfree`` reports to its user, and the exit code each stands for.

Every error a command can end with derives from :class:`CfreeError` and says, by its class,
which exit code the command returns: 2 for bad input (a config, roster, key file, graph, run
directory or command-line argument that cannot be used), 1 for a run or an audit that went
wrong. ``cfree``'s ``main`` prints the message and returns ``exit_code``; nothing else maps
exceptions to codes. The classes of each layer keep their other bases (``ValueError``,
``OSError``...) so existing ``except`` clauses still catch them.

A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

#: Bad input: the command cannot start with what it was given.
EXIT_BAD_INPUT = 2
#: The run or the audit failed (a peer failed, a strict audit found a problem).
EXIT_FAILED = 1
#: Interrupted by Ctrl-C or SIGTERM (128 + SIGINT).
EXIT_INTERRUPTED = 130


class CfreeError(Exception):
    """The root of every error ``cfree`` reports; ``exit_code`` is what the command returns."""

    exit_code: int = EXIT_BAD_INPUT


class InputError(CfreeError):
    """Something given to a command cannot be used (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class RunError(CfreeError):
    """A run or an audit that was started and failed (exit 1)."""

    exit_code = EXIT_FAILED


class UsageError(InputError, ValueError):
    """A command-line argument or a combination of them that cannot be used."""


def exit_code_of(exc: BaseException) -> int | None:
    """The exit code an exception stands for, or None if it is not one of ``cfree``'s."""
    if isinstance(exc, CfreeError):
        return exc.exit_code
    return None
