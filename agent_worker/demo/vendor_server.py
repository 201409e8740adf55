"""The demo vendor's server side (``agent_worker.demo.vendor`` starts it in
its own process): what it moved, kept in SQLite so a restart forgets nothing;
the three modes' answers to a repeated key; and the faults a test injects.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import socketserver
import sqlite3
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from agent_worker.demo.vendor_client import BY_KEY, Json, Mode

REFUND_LIMIT_CENTS = 1_000_000
_FAULT_ACTIONS = ("fail", "hang", "drop_after_apply", "clear")
_KINDS = {"/refunds": "refund", "/notices": "notice"}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, idem_key TEXT,
    request TEXT NOT NULL, status INTEGER NOT NULL, response TEXT NOT NULL,
    applied INTEGER NOT NULL, amount_cents INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS effects_key ON effects (idem_key, seq);
"""


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
            if path.startswith(BY_KEY):
                if state.mode == "plain":
                    return _error(501, "unsupported", "this vendor offers no lookup")
                found = state.lookup(unquote(path[len(BY_KEY) :]))
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


def serve(port: int, db_path: str, mode: Mode) -> None:
    """Answer requests on 127.0.0.1:``port`` until the process is killed."""
    server = _Server(("127.0.0.1", port), _Handler)
    server.state = VendorState(db_path, mode)
    server.serve_forever()


__all__ = ["REFUND_LIMIT_CENTS", "VendorState", "serve"]
