"""The base of ``AgentWorker``'s verb groups: the principal (as
``AccessControl`` applies it) and the few helpers every group shares (the
actor of a verb, a caller's JSON admitted, a run's next lap sent, the SQL
store, a run read)."""

from __future__ import annotations

from typing import Any

from agent_worker.access import AccessControl, scoped
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.untrusted import clean, clean_text
from agent_worker.store.base import DueLap, RunRecord
from agent_worker.store.sql import SqlStore


def storable(*values: str | None) -> bool:
    """Whether each value could have been stored (a filter that could not
    matches nothing, and is not sent to the database)."""
    return all(v is None or (isinstance(v, str) and clean_text(v) == v) for v in values)


class Verbs(AccessControl):
    """What every verb group of ``AgentWorker`` stands on."""

    def _principal(self, by: object = None) -> str:
        """The one place the actor of a verb comes from: the id of the handle's
        principal, recorded as ``by``. A ``by`` argument (from a verb written
        before principals) is ignored: what the store records never comes from
        free text."""
        return self.principal.id

    def _admit(self, value: Any, what: str) -> Any:
        """A caller's JSON value under the rule of ``agent_worker.core.untrusted``."""
        return clean(value, max_depth=self.rt.settings.max_json_depth, what=what, strict=True)

    def _send_next(self, run: RunRecord) -> None:
        self.rt.send_all([DueLap(run.id, run.next_lap, run.agent_name, run.agent_version)])

    def _sql(self) -> SqlStore:
        """The store's SQL side, for the verbs outside the lap's narrow protocol."""
        store = self.rt.store
        if not isinstance(store, SqlStore):
            raise ConfigurationError("this verb needs the SQL store")
        return store

    @scoped
    def get_run(self, run_id: str) -> RunRecord:
        """The run's current record. Raises ``UnknownRunError`` (also for a
        run of another tenant)."""
        run = self._visible(run_id)
        self._authorize("read", run)
        return run


__all__ = ["Verbs", "storable"]
