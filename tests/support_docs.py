"""The shell commands the READMEs and the documentation site (docs/) show, as
a reader would copy them: fenced ``sh`` blocks, indented blocks, and inline
code spans that start with a command; and the site's Python examples. Shared
by the README doc test, the docs examples test and the first-hour test."""

from __future__ import annotations

import re
import textwrap

from tests.support import ROOT

#: Every page of the documentation site, in path order (docs/hooks/ is code).
SITE_PAGES = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                          if "hooks" not in p.parts))
DOCS = ("README.md", "deploy/README.md", *SITE_PAGES)
# An inline code span counts as a command when it starts with one of these.
COMMAND_WORDS = ("agent-worker ", "celery ", "python ", "deploy/local/", "make ", "kubectl ",
                 "docker ", "systemctl ", "curl ")


def _lines(block: str) -> list[str]:
    """Non-empty, non-comment lines with trailing ``# comments`` removed."""
    out = []
    for raw in block.splitlines():
        line = re.sub(r"\s+#(\s.*)?$", "", raw.strip())
        if line and not line.startswith("#"):
            out.append(line)
    return out


def fenced_blocks(text: str, heading: str | None = None) -> list[list[str]]:
    """The ``sh`` blocks of a Markdown text (only under ``heading``, if given)."""
    if heading is not None:
        start = text.index(f"\n### {heading}\n")
        end = text.find("\n#", start + len(heading) + 6)
        text = text[start: end if end > 0 else None]
    return [_lines(m.group(1)) for m in re.finditer(r"```(?:sh|bash)\n(.*?)```", text, re.S)]


def indented_blocks(text: str) -> list[list[str]]:
    """Indented code blocks: runs of lines indented 4+ spaces after a blank line."""
    return [_lines(m.group(1)) for m in re.finditer(r"\n\n((?:(?: {4,}).*\n|\n)+)", text)]


def inline_commands(text: str) -> list[str]:
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    return [s.strip() for s in spans if s.startswith(COMMAND_WORDS)]


def commands() -> list[tuple[str, str]]:
    """Every (document, command) pair, in document order per kind."""
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        # Indented blocks outside fences only: a fenced Python example's
        # indented lines are code, not commands.
        blocks = fenced_blocks(text) + indented_blocks(re.sub(r"```.*?```", "", text,
                                                              flags=re.S))
        found += [(doc, line) for block in blocks for line in block]
        found += [(doc, line) for line in inline_commands(text)]
    unique = list(dict.fromkeys(found))
    return unique


def readme_walkthrough() -> list[str]:
    """The README's "The first hour" commands, in order."""
    blocks = fenced_blocks((ROOT / "README.md").read_text(), "The first hour")
    return [line for block in blocks for line in block]


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` blocks of a Markdown text, in order, dedented."""
    return [textwrap.dedent(m.group(2)) for m in re.finditer(
        r"^([ \t]*)```python\n(.*?)^\1```", text, re.S | re.M)]


def read_docs() -> str:
    """README.md and every site page, joined: for facts that may live on either."""
    return "\n".join((ROOT / doc).read_text() for doc in ("README.md", *SITE_PAGES))
