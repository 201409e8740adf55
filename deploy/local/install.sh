#!/usr/bin/env bash
# Install what a fresh machine lacks: redis-server (Debian) and the package with
# its dev extra. Postgres binaries come with the base machine (pg_config --bindir).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v redis-server >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
if ! command -v pg_config >/dev/null 2>&1 && ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
python -m pip install -q --root-user-action=ignore -e '.[dev]'
