"""One root for the errors a user can cause or meet, each carrying the exit code it ends in.

Every error the CLI reports as a clean message (no traceback) derives from :class:`CfreeError`;
``cfree`` prints ``cfree COMMAND: error: MESSAGE`` and exits with the error's ``exit_code``.
Bad input (configs, rosters, keys, logs, arguments) is 2; a run, a lab or a peer that failed is
1. Each module keeps its own subclass (``ConfigError``, ``RosterError``, ``AuditError``, ...)
so callers can catch what they handle; the classes keep their historical second base
(``ValueError``, ``RuntimeError``) so existing ``except`` clauses still match.

A leaf module: it imports nothing from the package, so anything may import it.
"""

from __future__ import annotations

#: Exit codes of ``cfree``.
EXIT_OK = 0
EXIT_FAILED = 1  # a run, audit or peer that did not complete
EXIT_BAD_INPUT = 2  # a config, roster, key, log or argument that is wrong
EXIT_INTERRUPTED = 130


class CfreeError(Exception):
    """The root of the package's user-facing errors."""

    exit_code: int = EXIT_BAD_INPUT


class ConfigError(CfreeError, ValueError):
    """A configuration problem; the message names the source and the key."""


class AuditError(CfreeError, RuntimeError):
    """A run directory, log or request the auditor cannot work with."""


class InputError(CfreeError):
    """Something given to a command cannot be used (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class RunError(CfreeError):
    """A run or an audit that was started and failed (exit 1)."""

    exit_code = EXIT_FAILED


class UsageError(InputError, ValueError):
    """A command-line argument or a combination of them that cannot be used."""


class LaunchError(CfreeError, RuntimeError):
    """Peers that could not be started or supervised as asked (``cluster.local``)."""


def exit_code_of(exc: BaseException) -> int | None:
    """The exit code an exception stands for, or None if it is not one of ``cfree``'s."""
    if isinstance(exc, CfreeError):
        return exc.exit_code
    return None
