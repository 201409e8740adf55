"""The lap engine: claim, load, model step, tool steps, commit. Never imports Celery."""
