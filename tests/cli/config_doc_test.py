#!/usr/bin/python3
"""docs/configuration.md lists every key of the run config with the default the binary prints,
and no key the config does not have: the documentation cannot drift from the code.

usage: config_doc_test.py PATH_TO_PRL PATH_TO_configuration.md [unittest args]
"""
import json
import os
import re
import subprocess
import sys
import unittest

PRL = None
DOC = None

ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| `(.*)` \| (.+) \|$")


class ConfigDocTest(unittest.TestCase):
    def test_every_key_and_default_is_documented_as_printed(self):
        printed = json.loads(subprocess.run([PRL, "run", "--print-config"], capture_output=True,
                                            text=True, check=True).stdout)
        with open(DOC) as f:
            rows = [ROW.match(line) for line in f]
        documented = {}
        for m in filter(None, rows):
            key = m.group(1) + "." + m.group(2)
            self.assertNotIn(key, documented, "%s is documented twice" % key)
            self.assertTrue(m.group(4).strip(), "%s has no meaning" % key)
            documented[key] = json.loads(m.group(3))
        expected = {s + "." + k: v for s, keys in printed.items() for k, v in keys.items()}
        self.assertEqual(sorted(set(expected) - set(documented)), [],
                         "keys missing from docs/configuration.md")
        self.assertEqual(sorted(set(documented) - set(expected)), [],
                         "docs/configuration.md lists keys the config does not have")
        for key, value in expected.items():
            self.assertEqual(documented[key], value, "the default of %s" % key)
            self.assertIs(type(documented[key]), type(value), "the type of %s" % key)


if __name__ == "__main__":
    PRL = sys.argv.pop(1)
    DOC = sys.argv.pop(1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
