"""The verdict line of the GPU test scripts that tools/gpu-run runs
(engine_share_test.py, copy_into_test.py): the last line printed is
"PASSED", "SKIPPED: why" or "FAILED: why", and the exit status is 0 only
when the test passed or skipped."""

import sys
import traceback


def run_as_script(test, skip):
    """Runs `test()`; an exception of class `skip` means SKIPPED."""
    try:
        test()
    except skip as e:
        print("SKIPPED: %s" % e)
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - the script's verdict line
        traceback.print_exc()
        print("FAILED: %s" % e)
        sys.exit(1)
    print("PASSED")
