"""The run console (issue 20): runs, a run's laps and ledger, the approvals
inbox and the actions on a run, in a browser, behind a login.

Starlette with server-rendered Jinja templates (autoescaped) and one small
script for the live parts; no build step. Every page acts as the logged-in
user's principal through ``AgentWorker.acting_as``: the tenant scope, the
roles and the audit log are the API's. Serve it with ``agent-worker console``.
"""

from __future__ import annotations

from agent_worker.console.app import app_from_settings, create_app
from agent_worker.console.users import UserBook, hash_password

__all__ = ["UserBook", "app_from_settings", "create_app", "hash_password"]
