"""MkDocs hook: the reference pages that are generated from the code at build
time, so they cannot drift from it.

- ``<!-- generated: cli -->`` becomes the CLI reference, walked from the typer
  app (``agent_worker.cli:app``): every command's usage, help and options.
- ``<!-- generated: schema -->`` becomes the database schema, read from the
  SQLAlchemy models of ``agent_worker.store`` (tables, columns, indexes).
- The configuration page keeps its table between ``<!-- config-table:start -->``
  and ``<!-- config-table:end -->`` (so it reads as Markdown in the repository
  too); the build fails when it differs from ``agent_worker.core.settings.config_table()``
  (tests/unit/test_docs_pages.py checks the same without a build).

Registered in mkdocs.yml under ``hooks:``; excluded from the site itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from mkdocs.exceptions import PluginError

CLI_MARK = "<!-- generated: cli -->"
SCHEMA_MARK = "<!-- generated: schema -->"
CONFIG_START, CONFIG_END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _command_markdown(command: Any, path: list[str], level: int) -> list[str]:
    # Duck-typed: typer ships a click of its own, so plain click's classes
    # are not the ones its commands are made of.
    name = " ".join(path)
    ctx = command.context_class(command, info_name=name)
    out = [f"{'#' * level} `{name}`", ""]
    help_text = (command.help or "").strip()
    if help_text:
        out += [help_text.replace("\b\n", ""), ""]
    out += ["```text", command.get_usage(ctx).strip(), "```", ""]
    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        kind = getattr(param, "param_type_name", "option")
        record = param.get_help_record(ctx)
        if record is None:  # a plain argument, no help of its own
            rows.append(f"| `{param.human_readable_name}` | {kind} | |")
            continue
        opts, help_part = record
        rows.append(f"| `{_cell(opts)}` | {kind} | {_cell(help_part)} |")
    if rows:
        out += ["| name | kind | what it is for |", "|---|---|---|", *rows, ""]
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                out += _command_markdown(sub, [*path, sub_name], min(level + 1, 4))
    return out


def cli_reference() -> str:
    """Markdown for every command of ``agent-worker``, in the app's order."""
    import typer.main

    from agent_worker.cli import app

    root = typer.main.get_command(app)
    return "\n".join(_command_markdown(root, ["agent-worker"], 2))


def _load_models() -> Any:
    import agent_worker.store as store
    from agent_worker.store.models import Base

    for module in pkgutil.iter_modules(store.__path__):
        if module.name != "migrations":
            importlib.import_module(f"agent_worker.store.{module.name}")
    return Base


def schema_reference() -> str:
    """Markdown for every table the models declare (migrations create them)."""
    base = _load_models()
    docs = {mapper.local_table.name: (mapper.class_.__doc__ or "")
            for mapper in base.registry.mappers}
    out: list[str] = []
    for table in base.metadata.sorted_tables:
        out += [f"## `{table.name}`", ""]
        doc = " ".join(docs.get(table.name, "").split())
        if doc:
            out += [doc, ""]
        out += ["| column | type | null | key |", "|---|---|---|---|"]
        for column in table.columns:
            key = "primary" if column.primary_key else (
                "→ " + ", ".join(f"`{fk.target_fullname}`" for fk in column.foreign_keys)
                if column.foreign_keys else "")
            out.append(f"| `{column.name}` | `{_cell(str(column.type))}` | "
                       f"{'yes' if column.nullable else 'no'} | {key} |")
        indexes = sorted(table.indexes, key=lambda i: i.name or "")
        if indexes:
            out += ["", "Indexes: " + "; ".join(
                f"`{ix.name}` ({', '.join(c.name for c in ix.columns) or 'expression'}"
                f"{', unique' if ix.unique else ''})" for ix in indexes) + "."]
        out.append("")
    return "\n".join(out)


def check_config_table(markdown: str) -> None:
    from agent_worker.core.settings import config_table

    start = markdown.index(CONFIG_START) + len(CONFIG_START)
    end = markdown.index(CONFIG_END)
    if markdown[start:end].strip() != config_table().strip():
        raise PluginError("docs/reference/configuration.md: the configuration table differs "
                          "from agent_worker/core/settings.py; regenerate it with "
                          "python -c 'from agent_worker.core.settings import config_table; "
                          "print(config_table())'")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if SCHEMA_MARK in markdown:
        markdown = markdown.replace(SCHEMA_MARK, schema_reference())
    if CONFIG_START in markdown:
        check_config_table(markdown)
    return markdown
