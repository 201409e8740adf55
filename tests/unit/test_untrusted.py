"""The rule for untrusted text, identifiers, redaction and terminal-safe printing,
without a database."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.table import Table

from agent_worker.cli import common
from agent_worker.cli.terminal import strip_terminal
from agent_worker.core.errors import InvalidInputError, NestingTooDeepError
from agent_worker.core.redaction import _NAMES, _PATTERNS, redact_secrets
from agent_worker.core.untrusted import check_name, clean, clean_text

FFFD = "\ufffd"


def test_rule_replaces_only_what_postgres_cannot_hold() -> None:
    kept = "tab\t nl\n esc\x1b bell\x07 rtl\u200f\u202e emoji\U0001f600 gothic\U00010348 " + FFFD
    assert clean_text(kept) == kept
    assert clean_text("a\x00b\ud800c\udbffd\udc00e\udfff") == f"a{FFFD}b{FFFD}c{FFFD}d{FFFD}e{FFFD}"


def test_clean_walks_keys_values_and_bounds_depth_without_recursion_error() -> None:
    assert clean({"k\x00": ["v\ud800", ("t", 1, 2.5, None, True)]}, max_depth=5) == {
        f"k{FFFD}": [f"v{FFFD}", ["t", 1, 2.5, None, True]]}
    deep: Any = 0
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    with pytest.raises(NestingTooDeepError, match="nested deeper than 64 levels"):
        clean(deep, max_depth=64)
    assert isinstance(NestingTooDeepError("x"), InvalidInputError)


def test_clean_refuses_non_json_from_callers_but_keeps_tool_values_as_text() -> None:
    with pytest.raises(InvalidInputError):
        clean({"n": float("nan")}, max_depth=5, strict=True)
    with pytest.raises(InvalidInputError):
        clean(object(), max_depth=5, strict=True)
    assert clean({"n": float("inf")}, max_depth=5) == {"n": "inf"}


@pytest.mark.parametrize("value", ["ticket-1\n", "a\x00", "-lead", "", "a b", "x" * 201,
                                   "tab\t", "rtl\u202e", "é"])
def test_identifiers_are_full_matches_without_control_characters(value: str) -> None:
    with pytest.raises(InvalidInputError):
        check_name(value, "run_id")


def test_identifiers_accept_the_documented_alphabet() -> None:
    assert check_name("Ticket-1.retry_2", "run_id") == "Ticket-1.retry_2"


@pytest.mark.parametrize(("raw", "secret"), [
    ("HTTPError('https://api.test/weather?q=Oslo&appid=0123456789abcdef')", "0123456789abcdef"),
    ("GET /v1?api_key=AKxyz123&x=1", "AKxyz123"),
    ("{'Authorization': 'Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig'}", "eyJhbGciOiJIUzI1NiJ9"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    ('{"token": "t0k3n-value"}', "t0k3n-value"),
    ("key sk-proj-AbCdEf0123456789", "AbCdEf0123456789"),
    ("stripe sk_live_51Habcdefghijkl", "51Habcdefghijkl"),
    ("postgres://app:hunter2@db:5432/x", "hunter2"),
    ("client_secret=s3cr3t; other=1", "s3cr3t"),
])
def test_default_redaction_removes_common_credential_shapes(raw: str, secret: str) -> None:
    assert secret not in redact_secrets(raw)
    assert "[redacted]" in redact_secrets(raw)


@pytest.mark.parametrize("text", ["refund of 1000 cents for order o1 applied",
                                  "token verification failed", "basic information",
                                  '{"key": "run-1:2:0", "tokens": 42}'])
def test_default_redaction_leaves_ordinary_text_alone(text: str) -> None:
    assert redact_secrets(text) == text


def _every_pattern(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


#: Pieces of the credential shapes, their clues and near misses, for texts
#: the screen in ``redact_secrets`` must not tell apart from running every pattern.
_PIECES = ["Bearer ", "authorization: basic ", "AUTHORIZATION", "api_key", "Token", "=", ": ",
           '"', "'", "secret", "PassWord", "pwd", "appid", "sig", "x-api-key", "sk-", "sk_live_",
           "rk_test_", "pk-", "ghp_", "gho_", "xoxb-", "AKIA", "AIza", "https://", "u:p@", "@",
           "://", "0123456789abcdefABCDEF", "_-", " ", "\n", "&", ";", "}", "k", "K",
           "\u017fecret=", "to\u212aen=", "\u00e9"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=24).map("".join))
def test_redaction_screen_never_changes_the_outcome(text: str) -> None:
    """Was: all eight patterns ran over every string (60 us for a 400-character
    tool result); the screen skips those whose clues are absent."""
    assert redact_secrets(text) == _every_pattern(text)


@pytest.mark.parametrize("name", sorted({n.replace("[_-]?", sep) for n in _NAMES.split("|")
                                         for sep in ("", "_", "-")}))
def test_redaction_screen_knows_every_credential_name(name: str) -> None:
    for text in (f"{name}=v4lue-1", f'{{"{name.upper()}": "v4lue-1"}}'):
        assert redact_secrets(text) == _every_pattern(text) != text


def test_redaction_folds_case_like_the_patterns_outside_ascii() -> None:
    assert "s3cr3t" not in redact_secrets("\u017fecret=s3cr3t")
    assert "abc123" not in redact_secrets("to\u212aen=abc123 \u00e9")


HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\x1b[1;1Hfake line\rover\x9b31m\x00 end"


def test_strip_terminal_removes_escape_sequences_and_controls() -> None:
    shown = strip_terminal(HOSTILE + "\nnext\tcol")
    assert shown == f"okfake line{FFFD}over{FFFD} end\nnext\tcol"


def test_cli_console_never_prints_terminal_control_from_text() -> None:
    """Was: ``runs show --laps`` and ``runs tail`` printed model and tool text raw."""
    table = Table()
    table.add_column("result")
    table.add_row(HOSTILE)
    with common.console.capture() as captured:
        common.console.print(f"model: {HOSTILE}", markup=False)
        common.console.print(table)
    out = captured.get()
    for control in ("\x1b]", "\x1b[2J", "\x1b[1;1H", "\x07", "\r", "\x9b", "\x00"):
        assert control not in out
    assert "fake line" in out


def test_cli_error_line_never_prints_terminal_control(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    common.report(1, "lap_error", HOSTILE)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.startswith("error: lap_error: ok")


def test_cli_json_arguments_nested_too_deep_are_bad_input() -> None:
    """Was: a raw RecursionError, reported as ``error: internal``."""
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(common.CliFailure) as caught:
        common.parse_json_arg(deep, "--payload")
    assert caught.value.exit_code == common.BAD_INPUT
