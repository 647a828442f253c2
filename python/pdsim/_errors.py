"""The exceptions of the pdsim package.

Bad input (a scenario, a sweep, an argument) raises :class:`PdsimError`, a
``ValueError``; a scenario file refused raises its subclass
:class:`ScenarioError`. Their text is the one line ``pdsim`` prints on the
command line, and ``file``, ``line`` and ``field`` say where the problem is
(``None`` where it has no such place). A bug in pdsim raises
:class:`InternalError`.
"""

from __future__ import annotations

import re

__all__ = ["PdsimError", "ScenarioError", "InternalError"]


class PdsimError(ValueError):
    """Bad input: a scenario, a sweep, a trace or an argument.

    ``str(e)`` is the command line's one-line message; ``file``, ``line``
    (1-based) and ``field`` (a dotted path such as
    ``workload.arrival.rate_per_s``) place it where it has a place, and
    ``message`` is the problem alone.
    """

    def __init__(
        self,
        text: str,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        message: str | None = None,
    ) -> None:
        super().__init__(text)
        self.file = file
        self.line = line
        self.field = field
        self.message = text if message is None else message


class ScenarioError(PdsimError):
    """A scenario refused: ``file`` is the file as named (``<string>`` for
    TOML text, ``<dict>`` for a dict, or the overrides applied), ``line``
    the line of the field in it (``None`` when the field is in no file),
    ``field`` the dotted path of the field."""


class InternalError(RuntimeError):
    """pdsim failed on good input: a bug in pdsim (please report it)."""


# `file:line: field: problem`, as the harness writes a place (a trace row,
# a sweep key); a field is a dotted path, perhaps with quoted keys or an
# index (`zip[0]."decode.count"`).
_PLACED = re.compile(
    r'^(?P<file>[^\n]+?):(?P<line>\d+): (?:(?P<field>[A-Za-z_][\w.\[\]"-]*): )?(?P<message>.*)$', re.S
)


def _bad_input(text: str) -> PdsimError:
    """A :class:`PdsimError` for a message of the harness, placed when it
    starts with ``file:line:``."""
    m = _PLACED.match(text)
    if m is None:
        return PdsimError(text)
    return PdsimError(text, m["file"], int(m["line"]), m["field"], m["message"])
