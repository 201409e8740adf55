"""Benchmarks: agent-worker's durability layer against LangGraph's Postgres
checkpointer, on one shared workload (``bench.workload``).

``python -m bench.run`` reproduces every figure in BENCHMARKS.md (``--quick``
for a smoke run). The harness is not part of the test suite: it needs real
services, takes minutes, and its figures depend on the machine.
"""
