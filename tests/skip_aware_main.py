"""unittest.main for prl's Python tests under ctest: exit 77 (the tests' SKIP_RETURN_CODE) when
any test was skipped and none failed, so that a run that skipped what it was meant to test
(missing npm references, promtool, torch) reads as skipped, never as passed."""
import sys
import unittest


def main():
    program = unittest.main(exit=False)
    result = program.result
    if not result.wasSuccessful():
        return 1
    if result.skipped:
        reasons = sorted({reason for _, reason in result.skipped})
        print("skipped %d of %d tests: %s" % (len(result.skipped), result.testsRun,
                                              "; ".join(reasons)), file=sys.stderr)
        return 77
    return 0
