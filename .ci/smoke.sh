#!/usr/bin/env bash
# Build the wheel and the sdist, install the wheel (not editable) in fresh venvs and run it
# from outside the checkout: next to supervisord's package and an application package named
# `migrations`; and the base install alone, which must import without the supervisor's deps.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d /tmp/echomq-smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/build" && "$work/build/bin/pip" install -q build
"$work/build/bin/python" -m build -q --wheel --sdist --outdir "$work/dist" "$repo" >/dev/null
wheel=$(ls "$work"/dist/echomq-*.whl)
ls "$work"/dist/echomq-*.tar.gz >/dev/null

# the base install: a producer's
python3 -m venv "$work/base" && "$work/base/bin/pip" install -q "$wheel"
(cd "$work" && "$work/base/bin/python" "$repo/.ci/smoke_base.py")

# the supervisor install, beside supervisord and an application's own `migrations` package
python3 -m venv "$work/full"
"$work/full/bin/pip" install -q "${wheel}[supervisor,valkey]" supervisor
mkdir -p "$work/app/migrations"
echo 'APP_OWN = True' > "$work/app/migrations/__init__.py"
cp "$repo/.ci/smoke_jobs.py" "$work/app/smoke_jobs.py"
(cd "$work" && PATH="$work/full/bin:$PATH" PYTHONPATH="$work/app" \
  "$work/full/bin/python" "$repo/.ci/smoke_full.py")
echo "smoke: wheel and sdist built; base and supervisor installs work from $wheel"
