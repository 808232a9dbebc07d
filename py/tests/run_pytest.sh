#!/usr/bin/env bash
# Runs the Python client's tests with Debian's python3 and pytest, against the
# kvbrokerd binary and generated modules Bazel put in the runfiles (the
# working directory). pytest exit 5 ("no tests collected") is a failure like
# any other non-zero status: a run that tested nothing must not pass.
set -euo pipefail

export KVBROKERD=$PWD/server/kvbrokerd
export PYTHONPATH=$PWD/py
export PYTHONDONTWRITEBYTECODE=1
tmp=${TEST_TMPDIR:-$(mktemp -d)}

set +e
/usr/bin/python3 -m pytest -p no:cacheprovider --basetemp="$tmp/pytest" \
  -ra -v "$PWD/py/tests"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests" >&2
fi
exit "$rc"
