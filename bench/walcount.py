"""WAL bytes one database wrote between two LSNs, by relation.

``pg_current_wal_lsn()`` differences count every database of the cluster; on
a server shared with other engineers' test runs that is mostly their WAL. So
this reads the records themselves with ``pg_waldump`` and keeps those whose
block reference names the database (``rel <tablespace>/<db oid>/<relfilenode>``),
plus the commit records of the transactions that wrote them.

``pg_waldump`` reads the server's WAL directory, so it runs as the ``postgres``
OS user (``runuser``; the local cluster of ``deploy/local/services.sh``) and the
data directory is asked of a superuser over the Unix socket in ``/tmp``.
Without that access ``wal_bytes`` returns ``None`` and the benches print "n/a".

On a busy cluster the segments are recycled within a minute (measured: 350 MB
of WAL in one minute of six test suites), so a sample runs inside
``held()``: a physical replication slot that keeps the WAL from its start
until the sample's WAL has been read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from bench.common import PG_ADMIN

_RECORD = re.compile(r"rmgr: (\w+)\s+len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+)")


@dataclass
class Wal:
    """WAL of one database: total bytes and bytes per relfilenode ("commit"
    for the transactions' commit records)."""

    total: int = 0
    by_relation: dict[str, int] = field(default_factory=dict)


def _port() -> str:
    found = re.search(r":(\d+)/", PG_ADMIN)
    return found.group(1) if found else "5432"


def _as_postgres(*cmd: str, check: bool = True) -> str:
    prefix = ["runuser", "-u", "postgres", "--"] if shutil.which("runuser") else []
    out = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=300,
                         check=check)
    return out.stdout


def _waldump() -> str:
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                            check=False).stdout.strip()
    path = f"{bindir}/pg_waldump" if bindir else "pg_waldump"
    return path if shutil.which(path) else "pg_waldump"


@contextmanager
def held() -> Iterator[None]:
    """Keep the cluster's WAL from now until the block ends (a replication
    slot of this process; nothing happens where the superuser is out of reach)."""
    slot = f"aw_walcount_{os.getpid()}"
    sql = ["psql", "-h", "/tmp", "-p", _port(), "-Atc"]
    try:
        _as_postgres(*sql, f"SELECT pg_create_physical_replication_slot('{slot}', true)")
    except (OSError, subprocess.SubprocessError):
        yield
        return
    try:
        yield
    finally:
        _as_postgres(*sql, f"SELECT pg_drop_replication_slot('{slot}')", check=False)


def wal_bytes(db_oid: int, start_lsn: str, end_lsn: str) -> Wal | None:
    """The WAL ``db_oid`` wrote in ``[start_lsn, end_lsn)``, or ``None`` when
    the WAL cannot be read here."""
    try:
        data_dir = _as_postgres("psql", "-h", "/tmp", "-p", _port(), "-Atc",
                                "SHOW data_directory").strip()
        # Not checked: the last record before ``end_lsn`` may not be on disk yet
        # (an asynchronous commit), and pg_waldump then exits non-zero after
        # printing every record before it.
        dump = _as_postgres(_waldump(), "-p", f"{data_dir}/pg_wal", "-s", start_lsn,
                            "-e", end_lsn, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if not dump:
        return None
    wal, xids = Wal(), set()
    marker = re.compile(rf"rel \d+/{db_oid}/(\d+)")
    commits: list[tuple[str, int]] = []
    for line in dump.splitlines():
        rec = _RECORD.search(line)
        if rec is None:
            continue
        size, xid = int(rec.group(2)), rec.group(3)
        if rec.group(1) == "Transaction":
            commits.append((xid, size))
            continue
        rel = marker.search(line)
        if rel is not None:
            wal.total += size
            wal.by_relation[rel.group(1)] = wal.by_relation.get(rel.group(1), 0) + size
            xids.add(xid)
    for xid, size in commits:
        if xid in xids:
            wal.total += size
            wal.by_relation["commit"] = wal.by_relation.get("commit", 0) + size
    return wal


__all__ = ["Wal", "held", "wal_bytes"]
