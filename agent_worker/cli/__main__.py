"""``python -m agent_worker.cli`` (same as the ``agent-worker`` script)."""

from agent_worker.cli import main

main()
