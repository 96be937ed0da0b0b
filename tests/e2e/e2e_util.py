"""What the e2e tests share: a free loopback port, and running the prl binary under test.

The test's main sets PRL (the binary's absolute path) before running the tests.
"""
import socket
import subprocess

PRL = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, check=False, timeout=300):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s" % (" ".join(map(str, args)),
                                                         proc.returncode, proc.stderr))
    return proc
