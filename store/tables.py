"""The whole schema: importing this module registers every table on
``Base.metadata``, which Alembic's environment and the schema test compare
with the migrations. Tables are declared beside the code that owns them
(``store.models`` for runs, ``store.sharemodels``, ``store.followers``,
``store.labelrows``, ``store.rollupmodels``); none of those imports this.
"""

from __future__ import annotations

from sqlalchemy import MetaData

from agent_worker.store import followers, labelrows, models, rollupmodels, sharemodels
from agent_worker.store.modelbase import Base

#: Every table of the schema.
metadata: MetaData = Base.metadata
#: The modules whose tables ``metadata`` holds (imported for that alone).
MODULES = (models, sharemodels, followers, labelrows, rollupmodels)

__all__ = ["MODULES", "metadata"]
