"""A fake payments/email vendor that runs as a real, separate, killable process.

Exactly-once claims only mean something across a real network hop and a real crash, so
this vendor lives in its own process, keeps what it "moved" in SQLite (a restart forgets
nothing), and can be told to fail, hang, or take the money and hang up. Its three modes
are the three kinds of vendor the effect ledger must cope with: Stripe-like idempotency
keys (``idempotent``), keys kept only for lookup (``lookup``), and no help at all
(``plain``). ``GET /stats`` is the test oracle: what really moved, whatever callers think.

Run: ``python -m agent_worker.demo.vendor --port PORT --db PATH --mode MODE``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import socketserver
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import quote, unquote, urlsplit

import httpx

from agent_worker.errors import ToolError

Mode = Literal["idempotent", "lookup", "plain"]
Json = dict[str, Any]
MODES: tuple[Mode, ...] = ("idempotent", "lookup", "plain")
REFUND_LIMIT_CENTS = 1_000_000
_FAULT_ACTIONS = ("fail", "hang", "drop_after_apply", "clear")
_KINDS = {"/refunds": "refund", "/notices": "notice"}
_BY_KEY = "/effects/by-key/"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, idem_key TEXT,
    request TEXT NOT NULL, status INTEGER NOT NULL, response TEXT NOT NULL,
    applied INTEGER NOT NULL, amount_cents INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS effects_key ON effects (idem_key, seq);
"""


class VendorUnavailable(Exception):
    """The vendor failed or went silent; whether the effect landed is unknown to the caller."""


class LookupUnsupported(ToolError):
    """The vendor cannot be asked what happened, so an unknown outcome stays unknown."""


def _dump(body: Json) -> str:
    return json.dumps(body, sort_keys=True)


def _error(status: int, kind: str, message: str) -> tuple[int, str]:
    return status, _dump({"error": {"type": kind, "message": message}})


def _validate(kind: str, req: Json) -> Json | str:
    """Validation failures are never stored (as at Stripe): a fixed retry may reuse the key."""
    if kind == "refund":
        order_id, amount = req.get("order_id"), req.get("amount_cents")
        if not isinstance(order_id, str) or not order_id:
            return "order_id must be a non-empty string"
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return "amount_cents must be a positive integer"
        return {"order_id": order_id, "amount_cents": amount}
    to, body = req.get("to"), req.get("body")
    if not isinstance(to, str) or "@" not in to:
        return "to must be an email address"
    if not isinstance(body, str):
        return "body must be a string"
    return {"to": to, "body": body}


def _outcome(kind: str, params: Json, key: str | None) -> tuple[int, str, bool]:
    """Business declines are stored and replayed like successes, as Stripe does."""
    if kind == "refund" and params["amount_cents"] > REFUND_LIMIT_CENTS:
        msg = f"refund declined: amount_cents exceeds the limit of {REFUND_LIMIT_CENTS}"
        return (*_error(402, "refund_declined", msg), False)
    prefix, status = ("re_", "succeeded") if kind == "refund" else ("nt_", "sent")
    body = {"id": prefix + secrets.token_hex(8), **params, "status": status}
    return 200, _dump({**body, "idempotency_key": key}), True


class VendorState:
    """One lock around one connection: requests are serialised, so check-then-insert is safe."""

    def __init__(self, db_path: str, mode: Mode) -> None:
        self.mode = mode
        self.lock = threading.Lock()
        self.faults: list[Json] = []
        # When each request arrived and was answered (``GET /_calls``): lets a test
        # prove that calls overlapped from the vendor's side, not the caller's.
        self.calls: list[Json] = []
        self.db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(_SCHEMA)

    def take_fault(self, path: str) -> Json | None:
        with self.lock:
            for fault in self.faults:
                if path.startswith(fault["path"]):
                    fault["count"] -= 1
                    if fault["count"] <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def set_fault(self, req: Json) -> str | None:
        action, count = req.get("action"), req.get("count", 1)
        path, seconds = req.get("path") or "", req.get("seconds") or 30.0
        if action not in _FAULT_ACTIONS:
            return f"action must be one of {', '.join(_FAULT_ACTIONS)}"
        if not isinstance(count, int) or count < 1 or not isinstance(path, str):
            return "count must be a positive integer and path a string"
        if not isinstance(seconds, int | float):
            return "seconds must be a number"
        with self.lock:
            if action == "clear":
                self.faults.clear()
            else:
                self.faults.append(
                    {"action": action, "count": count, "path": path, "seconds": seconds}
                )
        return None

    def apply(self, kind: str, params: Json, key: str | None) -> tuple[int, str]:
        request = _dump(params)
        with self.lock:
            if self.mode == "idempotent" and key is not None:
                row = self.db.execute(
                    "SELECT kind, request, status, response FROM effects"
                    " WHERE idem_key = ? ORDER BY seq LIMIT 1",
                    (key,),
                ).fetchone()
                if row is not None and (row["kind"], row["request"]) != (kind, request):
                    msg = f"Idempotency-Key {key!r} was already used with different parameters"
                    return _error(422, "idempotency_conflict", msg)
                if row is not None:
                    return int(row["status"]), str(row["response"])
            status, response, applied = _outcome(kind, params, key)
            self.db.execute(
                "INSERT INTO effects (kind, idem_key, request, status, response, applied,"
                " amount_cents) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (kind, key, request, status, response, int(applied), params.get("amount_cents", 0)),
            )
            return status, response

    def lookup(self, key: str) -> Json | None:
        with self.lock:
            row = self.db.execute(
                "SELECT kind, idem_key AS idempotency_key, request, status, response,"
                " (SELECT SUM(applied) FROM effects WHERE idem_key = ?1) AS applied_count"
                " FROM effects WHERE idem_key = ?1 ORDER BY seq DESC LIMIT 1",
                (key,),
            ).fetchone()
        if row is None:
            return None
        found = dict(row)
        return {
            **found,
            "request": json.loads(row["request"]),
            "response": json.loads(row["response"]),
        }

    def stats(self) -> Json:
        with self.lock:
            rows = self.db.execute(
                "SELECT kind, idem_key, amount_cents FROM effects WHERE applied = 1"
            ).fetchall()
        by_key = Counter(r["idem_key"] for r in rows if r["idem_key"] is not None)
        kinds = Counter(r["kind"] for r in rows)
        return {
            "applied": len(rows),
            "total_cents": sum(r["amount_cents"] for r in rows),
            "by_key": dict(by_key),
            "duplicates": sum(1 for n in by_key.values() if n > 1),
            "refunds": kinds["refund"],
            "notices": kinds["notice"],
        }

    def log_call(self, path: str, key: str | None, started: float, ended: float) -> None:
        with self.lock:
            self.calls.append({"path": path, "key": key, "started": started, "ended": ended})

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.calls.clear()
            self.db.execute("DELETE FROM effects")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: VendorState

    def server_bind(self) -> None:
        # Skip HTTPServer's getfqdn(): a reverse DNS lookup can stall startup for seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(b"")

    def do_POST(self) -> None:
        self._handle(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _handle(self, raw: bytes) -> None:
        state = cast(_Server, self.server).state
        path = urlsplit(self.path).path
        control = path.startswith("/_") or path in ("/healthz", "/stats")
        started = time.monotonic()
        fault = None if control else state.take_fault(path)
        action = fault["action"] if fault else None
        if action == "fail":
            self._send(*_error(500, "injected_fault", "injected failure, nothing applied"))
            return
        if fault and action == "hang":
            time.sleep(fault["seconds"])
        status, body = self._dispatch(state, path, raw)
        if not control:
            state.log_call(path, self.headers.get("Idempotency-Key"), started, time.monotonic())
        if action == "drop_after_apply":
            # RST instead of FIN: the caller sees a reset connection and no response at all.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        self._send(status, body)

    def _dispatch(self, state: VendorState, path: str, raw: bytes) -> tuple[int, str]:
        if self.command == "GET":
            if path == "/healthz":
                return 200, _dump({"ok": True, "mode": state.mode, "pid": os.getpid()})
            if path == "/stats":
                return 200, _dump(state.stats())
            if path == "/_calls":
                with state.lock:
                    return 200, json.dumps(state.calls)
            if path.startswith(_BY_KEY):
                if state.mode == "plain":
                    return _error(501, "unsupported", "this vendor offers no lookup")
                found = state.lookup(unquote(path[len(_BY_KEY) :]))
                if found is None:
                    return _error(404, "not_found", "no effect with this key")
                return 200, _dump(found)
            return _error(404, "not_found", f"no route GET {path}")
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = None
        if not isinstance(req, dict):
            return _error(400, "invalid_request", "body must be a JSON object")
        if path in _KINDS:
            params = _validate(_KINDS[path], req)
            if isinstance(params, str):
                return _error(400, "invalid_request", params)
            return state.apply(_KINDS[path], params, self.headers.get("Idempotency-Key"))
        if path == "/_faults":
            problem = state.set_fault(req)
            if problem:
                return _error(400, "invalid_request", problem)
            return 200, _dump({"ok": True})
        if path == "/_reset":
            state.reset()
            return 200, _dump({"ok": True})
        return _error(404, "not_found", f"no route POST {path}")

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class VendorClient:
    """Maps vendor answers onto the error split the engine relies on.

    A 4xx is a definite "no" the model should read (``ToolError``); a 5xx, timeout or
    dropped connection leaves the outcome unknown (``VendorUnavailable``).
    """

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout)

    def refund(self, order_id: str, amount_cents: int, *, idempotency_key: str | None) -> Json:
        body = {"order_id": order_id, "amount_cents": amount_cents}
        return self._effect("/refunds", body, idempotency_key)

    def notice(self, to: str, body: str, *, idempotency_key: str | None) -> Json:
        return self._effect("/notices", {"to": to, "body": body}, idempotency_key)

    def lookup(self, key: str) -> Json | None:
        resp = self._request("GET", _BY_KEY + quote(key, safe=""))
        if resp.status_code == 404:
            return None
        if resp.status_code == 501:
            raise LookupUnsupported(f"vendor at {self._http.base_url} offers no lookup by key")
        return self._json(resp)

    def stats(self) -> Json:
        return self._json(self._request("GET", "/stats"))

    def calls(self) -> list[Json]:
        """Every effect request the vendor answered: path, key, and when it
        arrived and was answered (the vendor's monotonic clock, in seconds)."""
        resp = self._request("GET", "/_calls")
        if resp.status_code != 200:
            raise VendorUnavailable(f"vendor answered {resp.status_code}: {resp.text}")
        return cast(list[Json], resp.json())

    def inject(
        self, action: str, count: int = 1, path: str | None = None, seconds: float | None = None
    ) -> None:
        body = {"action": action, "count": count, "path": path, "seconds": seconds}
        self._json(self._request("POST", "/_faults", json=body))

    def reset(self) -> None:
        self._json(self._request("POST", "/_reset"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VendorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _effect(self, path: str, body: Json, key: str | None) -> Json:
        headers = {"Idempotency-Key": key} if key is not None else {}
        return self._json(self._request("POST", path, json=body, headers=headers))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise VendorUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _json(resp: httpx.Response) -> Json:
        if resp.status_code >= 500:
            raise VendorUnavailable(f"vendor answered {resp.status_code}: {resp.text}")
        if resp.status_code >= 400:
            try:
                message = str(resp.json()["error"]["message"])
            except (ValueError, KeyError, TypeError):
                message = resp.text
            raise ToolError(f"{message} (vendor HTTP {resp.status_code})")
        return cast(Json, resp.json())


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
    server = _Server(("127.0.0.1", args.port), _Handler)
    server.state = VendorState(args.db, args.mode)
    server.serve_forever()


if __name__ == "__main__":
    main()
