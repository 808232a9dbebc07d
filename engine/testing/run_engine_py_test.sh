#!/usr/bin/env bash
# Runs a pytest file of kvbroker.engine (the first argument; default
# engine/testing/engine_py_test.py) with Debian's python3 against the
# kvbrokerd and kvbrokerctl binaries and libkvbroker_engine.so from the
# runfiles (the working directory). pytest's "no tests collected" (5) fails
# like any other status.
set -euo pipefail

export KVBROKERD=$PWD/server/kvbrokerd
export KVBROKERCTL=$PWD/client/kvbrokerctl
export KVBROKER_ENGINE_LIBRARY=$PWD/engine/libkvbroker_engine.so
export PYTHONPATH=$PWD/py
export PYTHONDONTWRITEBYTECODE=1
tmp=${TEST_TMPDIR:-$(mktemp -d)}
# Under --config=asan the library expects the ASan runtime, which Debian's
# python3 does not carry: preload clang's (the tests start kvbrokerd and the
# example without it, as those binaries carry their own).
if nm -D --undefined-only "$KVBROKER_ENGINE_LIBRARY" | grep ' __asan_' >/dev/null; then
  export LD_PRELOAD=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
  export ASAN_OPTIONS=detect_leaks=0
fi
exec /usr/bin/python3 -m pytest -p no:cacheprovider --basetemp="$tmp/pytest" \
  -ra -v "$PWD/${1:-engine/testing/engine_py_test.py}"
