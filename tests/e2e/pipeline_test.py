#!/usr/bin/python3
"""The pipeline as separate processes on loopback: `prl coordinator`, `prl learner serve` and
`prl actor`s, driven by `prl submit`. A submitted prompt set completes; an actor killed with
kill -9 mid-run loses no prompt; a learner killed and restarted resumes from its checkpoint;
the learner's lag reflects the weight versions the actors generated with.

usage: pipeline_test.py PATH_TO_PRL [unittest args]
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

PRL = None


def run(*args, check=False, timeout=300):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s" % (" ".join(map(str, args)),
                                                         proc.returncode, proc.stderr))
    return proc


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_pipeline_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 1, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 64, "--vocab-size", 22,
            "--max-position-embeddings", 32, "--seed", 1, "--out", cls.model, check=True)
        rng = random.Random(3)
        cls.prompts = os.path.join(cls.dir, "prompts.jsonl")
        with open(cls.prompts, "w") as f:
            for _ in range(24):
                a, b = rng.randrange(100), rng.randrange(100)
                f.write(json.dumps({"text": "%d+%d=" % (a, b), "reference": str(a + b)}) + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.tag = "prl-e2e-%d-%s" % (os.getpid(), self.id().split(".")[-1][:20])
        self.work = os.path.join(self.dir, self.tag)
        os.makedirs(self.work)
        self.procs = {}
        self.port = None

    def tearDown(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        run("replay", "reset", self.tag + "-replay", "--force")
        if os.path.exists("/dev/shm/%s-weights" % self.tag):
            os.remove("/dev/shm/%s-weights" % self.tag)

    def start(self, name, *args):
        log = open(os.path.join(self.work, name + ".log"), "w")
        self.procs[name] = subprocess.Popen([PRL, *map(str, args)], stdout=log,
                                            stderr=subprocess.STDOUT, text=True)
        log.close()

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def start_coordinator(self):
        p = subprocess.Popen([PRL, "coordinator", "--model", self.model, "--log",
                              os.path.join(self.work, "prompts.log"), "--address",
                              "127.0.0.1:0", "--char-tokenizer", "--lease-ms", "1500",
                              "--heartbeat-ms", "300"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        match = re.search(r"on port (\d+)", line)
        self.assertIsNotNone(match, line)
        self.port = int(match.group(1))
        self.procs["coordinator"] = p

    def start_learner(self, name="learner"):
        self.start(name, "learner", "serve", "--model", self.model, "--replay",
                   self.tag + "-replay", "--weights", self.tag + "-weights", "--coordinator",
                   "127.0.0.1:%d" % self.port, "--groups-per-step", 4, "--lr", "1e-3",
                   "--checkpoint-dir", os.path.join(self.work, "ckpt"), "--checkpoint-every", 1,
                   "--max-lag", 8)

    def start_actor(self, name):
        self.start(name, "actor", "--model", self.model, "--coordinator",
                   "127.0.0.1:%d" % self.port, "--replay", self.tag + "-replay", "--weights",
                   self.tag + "-weights", "--char-tokenizer", "--name", name,
                   "--max-prompts-in-flight", 2)

    def submit(self):
        out = run("submit", self.prompts, "--server", "127.0.0.1:%d" % self.port, "--samples", 4,
                  "--max-tokens", 4, "--stop-token", 2, "--reward", "arithmetic", "--json",
                  check=True).stdout
        return json.loads(out.splitlines()[0])["prompt_set_id"]

    def status(self, set_id):
        out = run("status", set_id, "--server", "127.0.0.1:%d" % self.port, "--json",
                  check=True).stdout
        return json.loads(out)[0]

    def wait_done(self, set_id, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.status(set_id)
            if s["state"] == "done":
                return s
            time.sleep(0.2)
        self.fail("prompt set %s not done: %s\nlearner:\n%s" % (set_id, s, self.log("learner")))

    def wait_for(self, name, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log(name)):
                return
            time.sleep(0.1)
        self.fail("%s never printed %r:\n%s" % (name, pattern, self.log(name)))

    def test_a_submitted_set_completes_and_the_learner_trains_on_it(self):
        self.start_coordinator()
        self.start_learner()
        self.start_actor("a0")
        set_id = self.submit()
        status = self.wait_done(set_id)
        self.assertEqual(status["prompts_done"], 24)
        self.wait_for("learner", r"step 6: version 6, 4 groups")
        steps = re.findall(r"lag mean ([\d.]+) max (\d+)", self.log("learner"))
        self.assertEqual(len(steps), 6)
        # The actor swapped in the versions the learner published while it generated: groups
        # trained on later lag behind by at least one version.
        self.assertGreater(max(int(m) for _, m in steps), 0)

    def test_a_killed_actor_loses_no_prompt(self):
        self.start_coordinator()
        self.start_learner()
        self.start_actor("a0")
        self.start_actor("a1")
        set_id = self.submit()
        deadline = time.time() + 120
        while self.status(set_id)["prompts_done"] < 4 and time.time() < deadline:
            time.sleep(0.05)
        self.procs["a0"].send_signal(signal.SIGKILL)
        status = self.wait_done(set_id)
        self.assertEqual(status["prompts_done"], 24)
        self.assertEqual(status["prompts_in_flight"], 0)

    def test_a_killed_learner_resumes_from_its_checkpoint(self):
        self.start_coordinator()
        self.start_learner()
        self.start_actor("a0")
        set_id = self.submit()
        self.wait_for("learner", r"step 2: version 2")
        self.procs["learner"].send_signal(signal.SIGKILL)
        self.procs["learner"].wait()
        self.start_learner("learner2")
        self.wait_for("learner2", r"learner: resumed from .* at step [2-9]")
        resumed = int(re.search(r"at step (\d+)", self.log("learner2")).group(1))
        self.wait_done(set_id)
        # New work trains on: the steps continue from the checkpoint, not from zero.
        self.wait_done(self.submit())
        self.wait_for("learner2", r"step %d: version" % (resumed + 1))
        self.assertNotIn("step 1: version 1,", self.log("learner2"))


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    unittest.main()
