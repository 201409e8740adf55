"""Core: the types and rules every layer shares, with no behaviour of its own.

Errors, the run vocabulary, messages, budgets, checkpoints, principals and
their authorization, settings, input checks, the clock, logs and fault
injection. Everything else in the package imports these; Core imports nothing
of ours outside ``agent_worker.core`` (only the standard library and pydantic),
so a store, an engine or a face can be read, tested and replaced without the
others coming along. ``tests/unit/test_import_graph.py`` enforces it.
"""
