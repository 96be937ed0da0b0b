#!/usr/bin/python3
"""kill -9 of an environment server mid-run: the episodes that needed it wait for it (their
groups leave the engine, no attempt is spent: coordinator.max_attempts is the default), start
again with new episode ids once it is back on its port, and the run completes with every prompt
trained exactly once; nothing half-finished is trained.

The pipeline as separate processes on loopback (coordinator, learner, one actor) and `prl env
serve` hosting the built-in guessing game, from one config file. Exactly learner.steps x
learner.groups_per_step prompts are submitted as agentic episodes, so the learner reaches its
last step only if every prompt is trained.

usage: env_kill_test.py PATH_TO_PRL [unittest args]
"""
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import e2e_util
from e2e_util import free_port, run, tiny_model

PRL = None
# Many more prompts than the coordinator leases ahead of the learner ((max_lag + 1) steps'
# worth): when the environment dies after step 2, most prompts still need it, however fast the
# learner and the actor got in between (on a loaded machine, 16 prompts could all be generated
# by then, and no episode would fail).
STEPS, GROUPS_PER_STEP = 24, 2


class EnvKillTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="prl_env_kill_")
        self.work = self.tmp.name
        self.procs = {}
        model = os.path.join(self.work, "model")
        tiny_model(model)
        self.env_address = "127.0.0.1:%d" % free_port()
        self.port = free_port()
        self.tag = "envkill-%d" % os.getpid()
        cfg = {
            "run": {"name": self.tag, "dir": self.work},
            "model": {"path": model},
            "coordinator": {"listen": "127.0.0.1:%d" % self.port, "lease_ms": 3000,
                            "heartbeat_ms": 300, "env_addresses": [self.env_address]},
            "learner": {"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "lr": 1e-3,
                        "checkpoint_every": STEPS, "max_lag": 4,
                        "report_file": os.path.join(self.work, "steps.jsonl")},
            "actors": {"max_prompts_in_flight": 2, "kv_cache_mb": 16},
        }
        self.config = os.path.join(self.work, "config.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.prompts = os.path.join(self.work, "prompts.jsonl")
        with open(self.prompts, "w") as f:
            for i in range(STEPS * GROUPS_PER_STEP):
                f.write(json.dumps({"text": "(1-100)=", "reference": str(1 + (37 * i) % 100)})
                        + "\n")

    def tearDown(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        run("replay", "reset", "prl-%s-replay" % self.tag, "--force")
        weights = "/dev/shm/prl-%s-weights" % self.tag
        if os.path.exists(weights):
            os.remove(weights)
        self.tmp.cleanup()

    def start(self, name, *args):
        log = open(os.path.join(self.work, name + ".log"), "a")
        self.procs[name] = subprocess.Popen([PRL, *map(str, args)], stdout=log,
                                            stderr=subprocess.STDOUT, text=True)
        log.close()

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def wait_for(self, name, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log(name)):
                return True
            if self.procs[name].poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def steps_done(self):
        path = os.path.join(self.work, "steps.jsonl")
        if not os.path.exists(path):
            return 0
        with open(path) as f:
            return sum(1 for _ in f)

    def test_episodes_of_a_killed_environment_wait_for_it_and_run_again(self):
        self.start("env", "env", "serve", "--listen", self.env_address)
        self.assertTrue(self.wait_for("env", "EnvironmentService"), self.log("env"))
        self.start("coordinator", "coordinator", "--config", self.config)
        self.assertTrue(self.wait_for("coordinator", "coordinator on port"), self.log("coordinator"))
        self.start("learner", "learner", "serve", "--config", self.config)
        self.start("actor", "actor", "--config", self.config, "--name", "a0")
        proc = run("submit", self.prompts, "--server", "127.0.0.1:%d" % self.port, "--samples", 2,
                   "--max-tokens", 4, "--stop-token", 2, "--environment", "guess_number",
                   "--env-address", self.env_address, "--env-param", "higher_text=+",
                   "--env-param", "lower_text=-", "--env-param", "rules_text=#",
                   "--max-turns", 3, "--env-timeout-s", 1, "--json", check=True)
        set_id = json.loads(proc.stdout.splitlines()[0])["prompt_set_id"]
        # Some steps trained on episodes; then the environment dies mid-run.
        deadline = time.time() + 180
        while self.steps_done() < 2 and time.time() < deadline:
            time.sleep(0.05)
        self.assertGreaterEqual(self.steps_done(), 2, self.log("learner")[-2000:])
        self.procs["env"].send_signal(signal.SIGKILL)
        self.procs["env"].wait()
        # Its episodes wait for it, visibly (no attempt spent).
        self.assertTrue(self.wait_for("actor", r"waits for environment at " +
                                      re.escape(self.env_address), timeout=120),
                        self.log("actor")[-3000:])
        self.start("env", "env", "serve", "--listen", self.env_address)
        self.assertTrue(self.wait_for("env", "EnvironmentService"), self.log("env"))
        # The run completes: every prompt trained.
        learner = self.procs["learner"]
        try:
            learner.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.fail("the learner did not finish:\n" + self.log("learner")[-3000:] +
                      self.log("actor")[-3000:])
        self.assertEqual(learner.returncode, 0, self.log("learner")[-3000:])
        status = json.loads(run("status", set_id, "--server", "127.0.0.1:%d" % self.port,
                                "--json", check=True).stdout)[0]
        self.assertEqual(status.get("prompts_failed", 0), 0, status)
        self.assertEqual(status["prompts_done"], STEPS * GROUPS_PER_STEP, status)
        ledger = os.path.join(self.work, "checkpoints", "step-%08d" % STEPS, "trained_prompts.tsv")
        trained = collections.Counter()
        with open(ledger) as f:
            for line in f:
                _, s, i = line.rstrip("\n").split("\t")
                trained[(s, int(i))] += 1
        self.assertEqual(len(trained), STEPS * GROUPS_PER_STEP)
        self.assertEqual(max(trained.values()), 1)
        # KV kept across turns: of the context each next turn started from, the share the
        # actor's KV cache still held (the rest was computed again), from its metrics.
        port = re.search(r"metrics on port (\d+)", self.log("actor")).group(1)
        metrics = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port).read().decode()
        value = lambda name: float(re.search(r"^%s (\S+)$" % name, metrics, re.M).group(1))  # noqa: E731
        context = value("prl_episode_context_tokens_total")
        kept = value("prl_episode_context_kept_tokens_total")
        self.assertGreater(context, 0, "no episode went on after a reply")
        self.assertGreaterEqual(kept / context, 0.95, "%g of %g context tokens kept" % (kept, context))
        print("KV cache across turns: %d of %d context tokens kept (%.1f%%)"
              % (kept, context, 100 * kept / context), flush=True)
        self.assertNotIn("failed, released", self.log("actor"))
        print("environment killed after %d steps; its groups waited and ran again; %d prompts "
              "trained once" % (2, len(trained)), flush=True)


if __name__ == "__main__":
    PRL = e2e_util.PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
