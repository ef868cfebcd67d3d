#!/usr/bin/env bash
# Set up EchoMQ and run the supervisor on an example workload with the embedded SQLite floor.
# Uses the Redis/Valkey at ECHOMQ_REDIS_URL (default redis://127.0.0.1:6379/0).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -e .
export ECHOMQ_REDIS_URL="${ECHOMQ_REDIS_URL:-redis://127.0.0.1:6379/0}"
export ECHOMQ_FLOOR_URL="${ECHOMQ_FLOOR_URL:-sqlite:///$PWD/.demo-floor.sqlite3}"
.venv/bin/echomq-supervisor migrate
exec .venv/bin/python examples/demo.py
