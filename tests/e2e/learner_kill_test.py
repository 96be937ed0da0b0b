"""`prl learner serve` killed with SIGKILL between checkpoints, over a real replay segment,
continues bit-identically (issue 28: the in-process test stopped the learner cooperatively).

Two learners train 8 steps of 2 groups on the same 16 deterministic groups (tests/learner/
replay_fill.cc writes them into the run's segment first): one uninterrupted, one killed -9 once
step 4 is reported (after the checkpoint of step 3; steps take milliseconds, so the kill may
land after the one of step 6: either way before the last step, between two checkpoints) and
started again on its run's segment and checkpoints. Both must report the same losses for every step
and end with bit-identical fp32 weights in the checkpoint of step 8.

usage: learner_kill_test.py PRL REPLAY_FILL [unittest args]
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

PRL = REPLAY_FILL = None
STEPS, GROUPS_PER_STEP, SAMPLES = 8, 2, 4


class LearnerKillTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="prl_learner_kill_")
        self.model = os.path.join(self.tmp, "model")
        subprocess.run([PRL, "model", "init", "--preset", "tiny", "--seed", "3", "--out",
                        self.model], check=True, capture_output=True)
        with open(os.path.join(self.model, "config.json")) as f:
            self.vocab = json.load(f)["vocab_size"]
        self.names = []

    def tearDown(self):
        for name in self.names:
            for path in glob.glob("/dev/shm/prl-%s-*" % name):
                os.remove(path)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def prepare(self, tag):
        name = "kill%d-%s" % (os.getpid(), tag)
        self.names.append(name)
        run_dir = os.path.join(self.tmp, tag)
        os.makedirs(run_dir)
        config = {
            "run": {"name": name, "dir": run_dir},
            "model": {"path": self.model},
            "learner": {"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "checkpoint_every": 3,
                        "keep_checkpoints": 10, "lr": 1e-3, "max_lag": 1000,
                        "report_file": os.path.join(run_dir, "steps.jsonl")},
            # Nothing listens there: progress reports are best effort, no prompt goes back.
            "coordinator": {"listen": "127.0.0.1:9"},
            "broadcast": {"listen": "127.0.0.1:0"},
            "metrics": {"enabled": False},
        }
        path = os.path.join(run_dir, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        subprocess.run([REPLAY_FILL, "prl-%s-replay" % name, name, str(STEPS * GROUPS_PER_STEP),
                        str(SAMPLES), str(self.vocab), "11"], check=True)
        return run_dir, path

    def serve(self, run_dir, config, log_name):
        log = open(os.path.join(run_dir, log_name), "w")
        proc = subprocess.Popen([PRL, "learner", "serve", "--config", config], stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        return proc

    def read(self, run_dir, log_name):
        with open(os.path.join(run_dir, log_name)) as f:
            return f.read()

    def losses(self, run_dir):
        by_step = {}
        with open(os.path.join(run_dir, "steps.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                by_step[r["step"]] = r["loss"]  # a replayed step reports again: the same loss
        return by_step

    def final_weights(self, run_dir):
        step_dir = glob.glob(os.path.join(run_dir, "checkpoints", "*%08d*" % STEPS))
        self.assertEqual(len(step_dir), 1, os.listdir(os.path.join(run_dir, "checkpoints")))
        files = {}
        for path in sorted(glob.glob(os.path.join(step_dir[0], "**", "*.safetensors"),
                                     recursive=True)):
            with open(path, "rb") as f:
                files[os.path.relpath(path, step_dir[0])] = f.read()
        self.assertTrue(files, "no weights in " + step_dir[0])
        return files

    def test_a_learner_killed_between_checkpoints_continues_bit_identically(self):
        whole_dir, whole_config = self.prepare("whole")
        proc = self.serve(whole_dir, whole_config, "learner.log")
        self.assertEqual(proc.wait(timeout=600), 0, self.read(whole_dir, "learner.log"))

        killed_dir, killed_config = self.prepare("killed")
        proc = self.serve(killed_dir, killed_config, "learner.log")
        deadline = time.time() + 600
        while not re.search(r"^step 4:", self.read(killed_dir, "learner.log"), re.M):
            self.assertIsNone(proc.poll(), "the learner ended before step 4:\n" +
                              self.read(killed_dir, "learner.log"))
            self.assertLess(time.time(), deadline, "no step 4 within 600 s")
            time.sleep(0.01)
        # The kill lands mid-run: the process is alive and has not reached the next checkpoint.
        self.assertIsNone(proc.poll(), "the learner ended before the kill")
        proc.send_signal(signal.SIGKILL)
        self.assertEqual(proc.wait(), -signal.SIGKILL)
        self.assertFalse(re.search(r"^step %d:" % STEPS, self.read(killed_dir, "learner.log"),
                                   re.M), "killed after its last step")
        proc = self.serve(killed_dir, killed_config, "learner2.log")
        self.assertEqual(proc.wait(timeout=600), 0, self.read(killed_dir, "learner2.log"))
        # Resumed from the checkpoint of step 3 or 6 (whichever the kill followed), the steps
        # after it replayed from the journal or trained anew, up to the last.
        resumed = re.search(r"resumed from .* at step (\d+)", self.read(killed_dir, "learner2.log"))
        self.assertIsNotNone(resumed, self.read(killed_dir, "learner2.log"))
        self.assertIn(int(resumed.group(1)), (3, 6))
        self.assertRegex(self.read(killed_dir, "learner2.log"), r"(?m)^step %d:" % STEPS)

        whole, killed = self.losses(whole_dir), self.losses(killed_dir)
        self.assertEqual(sorted(whole), list(range(1, STEPS + 1)))
        self.assertEqual(whole, killed, "per-step losses differ")
        self.assertTrue(self.final_weights(whole_dir) == self.final_weights(killed_dir),
                        "the final fp32 weights differ")


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    REPLAY_FILL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
