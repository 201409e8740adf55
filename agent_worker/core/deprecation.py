"""Deprecations: a public name or argument that goes away keeps working for one
minor version with a ``DeprecationWarning`` naming its replacement, then is
removed (CHANGELOG.md lists each one under the version that deprecated it).

The warning points at the application's line, not ours: its stack level is
counted past every frame of this package, so it is right whatever chain of
our wrappers (module-level verbs, decorators) the call came through.
"""

from __future__ import annotations

import os
import sys
import warnings

#: The package's folder (this module sits in ``agent_worker/core``).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of the first caller outside this package, as seen from
    the function that calls ``warnings.warn`` (the caller of this function)."""
    frame = sys._getframe(2)  # the frame that called the one warning
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


def deprecated(message: str) -> None:
    """Warn, at the application's call, that something is deprecated."""
    warnings.warn(message, DeprecationWarning, stacklevel=_outside_stacklevel())


def ignored_by(verb: str, by: str | None) -> None:
    """The ``by=`` argument the decision verbs (approve, reject, cancel,
    retry, raise_budget, resolve_effect) took until the handle's principal
    replaced it: still accepted, ignored, with a warning. The audit log and
    the record say who from the principal, never from an argument the caller
    could set to anyone."""
    if by is None:
        return
    deprecated(f"{verb}(by=...) is deprecated and ignored, and will be removed in the next "
               f"minor version: who did it is taken from the client's principal; to act as "
               f"someone, use agent_worker.connect(principal) (or the handle's "
               f"acting_as(principal)) instead of by=")


__all__ = ["deprecated", "ignored_by"]
