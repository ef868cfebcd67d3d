#!/usr/bin/env bash
# Play a round of codemojex: 200 players and one flooder on a real supervisor, ~20 s.
# Needs only Python 3.11+: makes .venv, installs EchoMQ with the supervisor and an embedded
# Valkey, migrates a SQLite floor, then runs the round (ECHOMQ_REDIS_URL picks another server).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv
.venv/bin/pip install -q -e '.[supervisor,valkey]'
export ECHOMQ_FLOOR_URL="${ECHOMQ_FLOOR_URL:-sqlite:///$PWD/.codemojex-floor.sqlite3}"
.venv/bin/echomq-supervisor migrate >/dev/null
exec .venv/bin/python -m examples.codemojex.play "$@"
