"""``agent-worker ... --json`` run in this process against the client the
test configured (``api.configure``), its output or its error read back: the
engine tests of CLI commands share it."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from agent_worker.cli import main


def cli(*argv: str, code: int = 0) -> Any:
    """The command's JSON output; with a nonzero ``code`` expected, the error
    object of its one stderr line instead."""
    args = list(argv) if "--json" in argv else [*argv, "--json"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        got = main(args)
    assert got == code, (args, out.getvalue(), err.getvalue())
    if code:
        (line,) = err.getvalue().strip().splitlines()
        return json.loads(line)["error"]
    return json.loads(out.getvalue())
