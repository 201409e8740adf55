"""The settings' fields by concern, each group a ``BaseSettings`` of its own;
``agent_worker.core.settings`` assembles them into the one ``Settings`` class
(read from ``AGENT_WORKER_*``) that everything else reads."""
