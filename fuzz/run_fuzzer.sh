#!/usr/bin/env bash
# One fuzz test: run_fuzzer.sh DRIVER SEED_DIR [libFuzzer flags...]
#
# Under --config=fuzz, fuzzes for KVB_FUZZ_SECONDS (default 20) starting from
# the seeds, keeping what it learns in a scratch corpus, and fails on the
# first crash, sanitizer report, leak, timeout or out-of-memory; the input
# that failed is left in the test's undeclared outputs. Otherwise (the
# driver is the replay build) it runs each seed once.
set -euo pipefail
driver=$1
seeds=$2
shift 2
seconds=${KVB_FUZZ_SECONDS:-20}
scratch=${TEST_TMPDIR:-$(mktemp -d)}/corpus
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}
mkdir -p "$scratch" "$artifacts"
[[ -d $seeds ]] || { echo "no seed corpus at $seeds" >&2; exit 1; }
echo "$(basename "$driver"): $seconds s from $(ls "$seeds" | wc -l) seeds"
exec "$driver" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$scratch" "$seeds"
