"""What the e2e tests share: a free loopback port, running the prl binary under test, a tiny
model and arithmetic prompts, and a whole `prl run` from config sections.

The test's main sets PRL (the binary's absolute path) before running the tests.
"""
import json
import os
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


def run_prl(tmp, name, sections, defaults=None):
    """`prl run` on a loopback run named `name` in `tmp`/run, its config the defaults updated
    with `sections` ({section: {key: value}}, or "tenants": [...]). Returns (exit code, stdout, the summary or None,
    the learner's step reports)."""
    cfg = {
        "run": {"name": name, "dir": os.path.join(tmp, "run")},
        "coordinator": {"listen": "127.0.0.1:0"},
        "broadcast": {"listen": "127.0.0.1:0"},
    }
    for section, values in (defaults or {}).items():
        cfg.setdefault(section, {}).update(values)
    for section, values in sections.items():
        if isinstance(values, list):  # "tenants"
            cfg[section] = values
        else:
            cfg.setdefault(section, {}).update(values)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = subprocess.run([PRL, "run", "--config", path], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=1200)
    lines = out.stdout.strip().splitlines()
    summary = None
    if out.returncode == 0 and lines and lines[-1].startswith("summary: "):
        with open(lines[-1][len("summary: "):]) as f:
            summary = json.load(f)
    steps = []
    steps_path = os.path.join(tmp, "run", "learner_steps.jsonl")
    if os.path.exists(steps_path):
        with open(steps_path) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    return out.returncode, out.stdout, summary, steps
