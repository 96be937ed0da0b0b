"""What the e2e tests share: a free loopback port, running the prl binary under test, a tiny
model and arithmetic prompts.

The test's main sets PRL (the binary's absolute path) before running the tests.
"""
import json
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


def tiny_model(path):
    """A 1-layer random Qwen2-shaped model over the built-in character vocabulary (22 tokens),
    small enough for many processes on two cores."""
    run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 1, "--heads", 4,
        "--kv-heads", 2, "--intermediate-size", 64, "--vocab-size", 22,
        "--max-position-embeddings", 32, "--seed", 1, "--out", path, check=True)


def arithmetic_prompts(path, count, rng):
    """`count` prompts "a+b=" (a, b below 100, drawn from `rng`) with their answers, as JSONL."""
    with open(path, "w") as f:
        for _ in range(count):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"text": "%d+%d=" % (a, b), "reference": str(a + b)}) + "\n")
