"""A fake payments/email vendor that runs as a real, separate, killable process.

Exactly-once claims only mean something across a real network hop and a real crash, so
this vendor lives in its own process, keeps what it "moved" in SQLite (a restart forgets
nothing), and can be told to fail, hang, or take the money and hang up. Its three modes
are the three kinds of vendor the effect ledger must cope with: Stripe-like idempotency
keys (``idempotent``), keys kept only for lookup (``lookup``), and no help at all
(``plain``). ``GET /stats`` is the test oracle: what really moved, whatever callers think.

Run: ``python -m agent_worker.demo.vendor --port PORT --db PATH --mode MODE``. The
server is ``demo.vendor_server``, the client ``demo.vendor_client``; this module
owns the process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent_worker.demo.vendor_client import MODES as MODES
from agent_worker.demo.vendor_client import Json as Json
from agent_worker.demo.vendor_client import LookupUnsupported as LookupUnsupported
from agent_worker.demo.vendor_client import Mode as Mode
from agent_worker.demo.vendor_client import VendorClient as VendorClient
from agent_worker.demo.vendor_client import VendorUnavailable as VendorUnavailable
from agent_worker.demo.vendor_server import REFUND_LIMIT_CENTS as REFUND_LIMIT_CENTS
from agent_worker.demo.vendor_server import VendorState as VendorState
from agent_worker.demo.vendor_server import serve


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VendorProcess:
    """Owns a vendor subprocess so tests can crash and restart it on the same port and db."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        mode: Mode = "idempotent",
        *,
        port: int | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.db_path, self.mode = Path(db_path), mode
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        self.log_path = self.db_path.with_name(self.db_path.name + ".log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: VendorClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The vendor process (leader of its own process group), while running."""
        return None if self._proc is None else self._proc.pid

    @property
    def client(self) -> VendorClient:
        if self._client is None:
            raise RuntimeError("vendor is not running; call start() first")
        return self._client

    def start(self) -> VendorProcess:
        if self._proc is not None:
            return self
        cmd = [sys.executable, "-m", "agent_worker.demo.vendor", "--port", str(self.port)]
        cmd += ["--db", str(self.db_path), "--mode", self.mode]
        root = str(Path(__file__).resolve().parents[2])
        paths = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self._client = VendorClient(self.url)
        self._await_health(self._proc)
        return self

    def _await_health(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=0.5) as probe:
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError, ValueError):
                    # The pid check stops a stranger squatting on our port passing for us.
                    if probe.get(self.url + "/healthz").json().get("pid") == proc.pid:
                        return
                time.sleep(0.05)
        rc = proc.poll()
        self.stop()
        tail = self.log_path.read_text(errors="replace")[-2000:]
        why = f"not healthy after {self.startup_timeout}s" if rc is None else f"exited ({rc})"
        raise RuntimeError(f"vendor on {self.url} {why}; log {self.log_path}:\n{tail}")

    def stop(self) -> None:
        """SIGKILL, not a graceful stop: a vendor crash is exactly what callers must survive."""
        proc, self._proc = self._proc, None
        if self._client is not None:
            self._client.close()
            self._client = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self) -> VendorProcess:
        self.stop()
        return self.start()

    def __enter__(self) -> VendorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vendor(db_path: str | os.PathLike[str], mode: Mode = "idempotent") -> VendorProcess:
    return VendorProcess(db_path, mode).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake payments/email vendor for tests and demos.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--mode", choices=MODES, default="idempotent")
    args = parser.parse_args(argv)
    serve(args.port, args.db, args.mode)


if __name__ == "__main__":
    main()
