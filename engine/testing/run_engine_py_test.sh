#!/usr/bin/env bash
# Runs kvbroker.engine's pytest suite with Debian's python3 against the
# kvbrokerd binary and libkvbroker_engine.so from the runfiles (the working
# directory). pytest's "no tests collected" (5) fails like any other status.
set -euo pipefail

export KVBROKERD=$PWD/server/kvbrokerd
export KVBROKER_ENGINE_LIBRARY=$PWD/engine/libkvbroker_engine.so
export PYTHONPATH=$PWD/py
export PYTHONDONTWRITEBYTECODE=1
tmp=${TEST_TMPDIR:-$(mktemp -d)}
exec /usr/bin/python3 -m pytest -p no:cacheprovider --basetemp="$tmp/pytest" \
  -ra -v "$PWD/engine/testing/engine_py_test.py"
