#!/usr/bin/python3
"""Prints the end of each failed test's output from a ctest run's LastTest.log, after ctest's own
summary, so that the last lines of a CI log say why a test failed (ctest prints a failed test's
output where it ended, and the summary's list of skips pushes it out of a short tail).

usage: failed_tests_tail.py BUILD_DIR [LINES]
"""
import os
import sys


def main():
    build = sys.argv[1]
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    temp = os.path.join(build, "Testing", "Temporary")
    try:
        with open(os.path.join(temp, "LastTestsFailed.log")) as f:
            failed = [l.strip().split(":", 1)[1] for l in f if ":" in l]
        with open(os.path.join(temp, "LastTest.log"), errors="replace") as f:
            log = f.read()
    except OSError as e:
        print("failed_tests_tail: %s" % e)
        return 0
    for name in failed:
        start = log.find(" Testing: %s\n" % name)
        end = log.find('"%s" end time:' % name, start)
        if start < 0:
            continue
        block = log[start:end if end >= 0 else len(log)].splitlines()
        print("\n===== the last %d lines of %s's output =====" % (lines, name))
        print("\n".join(block[-lines:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
