#!/usr/bin/python3
"""`prl run` as a user runs it: one config file, every role a separate supervised process.

A short run completes and writes summary.json with the promised fields; sync mode trains on
samples of lag 0 only; an actor killed with kill -9 is restarted and nothing is lost; Ctrl-C
stops every role and removes the run's shared memory; every process serves /metrics that
promtool accepts; a bad config is refused naming the field.

usage: run_test.py PATH_TO_PRL [unittest args]
"""
import glob
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

PRL = None

# Small and quick: a short warm-start, few RL steps, small groups.
BASE = {
    "sft": {"steps": 60, "examples_per_step": 64},
    "learner": {"steps": 6, "groups_per_step": 4, "lr": 3e-4, "checkpoint_every": 2},
    "task": {"eval_prompts": 40, "samples_per_prompt": 4},
    "actors": {"count": 2, "max_prompts_in_flight": 4},
    # Free ports: tests (and other runs) on this machine must not collide on fixed ones.
    "coordinator": {"listen": "127.0.0.1:0", "lease_ms": 3000, "heartbeat_ms": 300},
    "broadcast": {"listen": "127.0.0.1:0"},
}


class RunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="prl_run_test_")
        self.name = "t%d-%s" % (os.getpid(), self.id().split(".")[-1][-12:])

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        for path in glob.glob("/dev/shm/prl-%s-*" % self.name):
            os.remove(path)

    def config(self, **sections):
        cfg = json.loads(json.dumps(BASE))
        cfg["run"] = {"name": self.name, "dir": os.path.join(self.tmp, "run")}
        for section, values in sections.items():
            cfg.setdefault(section, {}).update(values)
        path = os.path.join(self.tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def start(self, config, *extra):
        log = open(os.path.join(self.tmp, "run.out"), "w")
        proc = subprocess.Popen([PRL, "run", "--config", config, *extra], stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        log.close()
        return proc

    def output(self):
        with open(os.path.join(self.tmp, "run.out")) as f:
            return f.read()

    def wait_for(self, pattern, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline:
            match = re.search(pattern, self.output())
            if match:
                return match
            time.sleep(0.1)
        self.fail("never saw %r:\n%s" % (pattern, self.output()))

    def finish(self, proc, timeout=600):
        self.assertEqual(proc.wait(timeout=timeout), 0, self.output())
        last = self.output().strip().splitlines()[-1]
        self.assertTrue(last.startswith("summary: "), last)
        with open(last[len("summary: "):]) as f:
            return json.load(f)

    def test_a_run_completes_and_writes_its_summary(self):
        proc = self.start(self.config())
        summary = self.finish(proc)
        for key in ("eval_before", "eval_after", "steps", "samples", "tokens_per_second",
                    "mean_lag", "max_lag"):
            self.assertIn(key, summary)
        self.assertEqual(summary["steps"], 6)
        self.assertEqual(summary["samples"], 6 * 4 * 4)
        self.assertGreater(summary["tokens_per_second"], 0)
        self.assertTrue(0 <= summary["eval_before"] <= 1 and 0 <= summary["eval_after"] <= 1)
        self.assertEqual(len(summary["reward_curve"]), 6)
        # Completion lengths: every step's longest is at least the mean, and within max_tokens.
        mean, longest = summary["completion_tokens_mean"], summary["completion_tokens_step_max_mean"]
        self.assertGreater(mean, 0)
        self.assertLessEqual(mean, longest)
        self.assertLessEqual(longest, 6)  # task.max_tokens (default)
        out = self.output()
        # One progress line per learner step.
        self.assertEqual(len(re.findall(r"^step +\d+/6 \| version", out, re.M)), 6, out)
        self.assertTrue(os.path.exists(os.path.join(summary["model_final"], "config.json")))
        self.assertEqual(glob.glob("/dev/shm/prl-%s-*" % self.name), [])
        # Run data (prompts and completions in the step journal, the ledger, checkpoints, logs)
        # is private: no file or directory of the run grants anything to group or others.
        shared = []
        for root, dirs, files in os.walk(os.path.join(self.tmp, "run")):
            for name in dirs + files:
                mode = os.lstat(os.path.join(root, name)).st_mode
                if stat.S_IMODE(mode) & 0o077:
                    shared.append("%s %o" % (os.path.join(root, name), stat.S_IMODE(mode)))
        self.assertEqual(shared, [])
        self.assertTrue(glob.glob(os.path.join(self.tmp, "run", "checkpoints", "*")))

    def test_evaluation_runs_during_training_and_is_never_trained_on(self):
        # eval.*: the held-out prompts as an evaluation set, a round at version 0 and every 2
        # versions; the summary holds the curve, and the learner trains only the train groups.
        proc = self.start(self.config(eval={"every_versions": 2, "prompts": 16},
                                      learner={"steps": 30}))
        summary = self.finish(proc)
        curve = summary["eval_curve"]
        self.assertGreaterEqual(len(curve), 2, curve)
        self.assertEqual(curve[0]["version"], 0)
        versions = [r["version"] for r in curve]
        self.assertEqual(versions, sorted(set(versions)))
        for r in curve:
            self.assertEqual(r["prompts"] + r["prompts_failed"], 16)
            self.assertTrue(0 <= r["mean_reward"] <= 1 and 0 <= r["pass_at_1"] <= 1, r)
            self.assertEqual(r["mean_reward"], r["pass_at_1"])  # greedy, one sample, 0/1 reward
        out = self.output()
        self.assertEqual(len(re.findall(r"^eval at version \d+: mean reward", out, re.M)),
                         len(curve), out)
        self.assertEqual(summary["samples"], 30 * 4 * 4)  # train groups only
        # The learner's step reports carry the rounds that finished before each step.
        evals = []
        with open(os.path.join(self.tmp, "run", "learner_steps.jsonl")) as f:
            for line in f:
                evals += json.loads(line).get("evals", [])
        self.assertTrue(evals, "no step report carried an evaluation round")
        self.assertTrue(all(e["set"] == "%s eval" % self.name for e in evals), evals)
        self.assertLessEqual({e["version"] for e in evals}, set(versions))

    def test_two_runs_on_one_machine_with_default_ports_both_complete(self):
        # Neither config names a port: prl run gives each run's roles free ones (two
        # coordinators on 127.0.0.1:50051 would split each other's connections).
        runs = []
        for i in range(2):
            cfg = json.loads(json.dumps(BASE))
            del cfg["coordinator"]["listen"], cfg["broadcast"]
            cfg["run"] = {"name": "%s-%d" % (self.name, i),
                          "dir": os.path.join(self.tmp, "run-%d" % i)}
            path = os.path.join(self.tmp, "config-%d.json" % i)
            with open(path, "w") as f:
                json.dump(cfg, f)
            out = os.path.join(self.tmp, "run-%d.out" % i)
            with open(out, "w") as log:
                runs.append((subprocess.Popen([PRL, "run", "--config", path], stdout=log,
                                              stderr=subprocess.STDOUT, text=True), out))
        ports = []
        for proc, out in runs:
            code = proc.wait(timeout=900)
            with open(out) as f:
                text = f.read()
            self.assertEqual(code, 0, text)
            ports.append(re.search(r"coordinator on 127\.0\.0\.1:(\d+)", text).group(1))
            summary_line = text.strip().splitlines()[-1]
            with open(summary_line[len("summary: "):]) as f:
                self.assertEqual(json.load(f)["steps"], 6)
            for name in ("actor-0", "actor-1"):
                log = os.path.join(os.path.dirname(summary_line[len("summary: "):]), "logs",
                                   name + ".log")
                with open(log) as f:
                    self.assertNotIn("CANCELLED", f.read())
        self.assertNotEqual(ports[0], ports[1])
        for i in range(2):
            for path in glob.glob("/dev/shm/prl-%s-%d-*" % (self.name, i)):
                os.remove(path)

    def test_weights_reach_the_actors_over_grpc_too(self):
        # More steps than the other runs: each actor must have been sent a version before the
        # learner exits, whenever its process got going.
        proc = self.start(self.config(broadcast={"transport": "grpc", "listen": "127.0.0.1:0"},
                                      learner={"steps": 16}))
        summary = self.finish(proc)
        self.assertEqual(summary["steps"], 16)
        with open(os.path.join(self.tmp, "run", "logs", "learner.log")) as f:
            self.assertRegex(f.read(), r"weights over gRPC on port \d+")
        for actor in ("actor-0", "actor-1"):
            with open(os.path.join(self.tmp, "run", "logs", actor + ".log")) as f:
                log = f.read()
            versions = [int(v) for v in re.findall(r"weight version (\d+)", log)]
            self.assertTrue(versions and versions[-1] >= 1,
                            "%s never swapped:\n%s\n%s" % (actor, log[-3000:], self.output()))

    def test_weights_reach_the_actors_over_the_collective_transport(self):
        # broadcast.transport = nccl: a broadcast group (Gloo on the CPU, NCCL on GPUs) formed
        # through the learner's store.
        proc = self.start(self.config(broadcast={"transport": "nccl", "listen": "127.0.0.1:0"},
                                      learner={"steps": 16}))
        summary = self.finish(proc)
        self.assertEqual(summary["steps"], 16)
        with open(os.path.join(self.tmp, "run", "logs", "learner.log")) as f:
            self.assertIn("weights over a Gloo broadcast group", f.read())
        for actor in ("actor-0", "actor-1"):
            with open(os.path.join(self.tmp, "run", "logs", actor + ".log")) as f:
                log = f.read()
            versions = [int(v) for v in re.findall(r"weight version (\d+)", log)]
            self.assertTrue(versions and versions[-1] >= 1,
                            "%s never swapped:\n%s\n%s" % (actor, log[-3000:], self.output()))

    def test_sync_mode_trains_only_on_samples_of_the_current_weights(self):
        proc = self.start(self.config(), "--mode", "sync")
        summary = self.finish(proc)
        self.assertEqual(summary["mode"], "sync")
        self.assertEqual(summary["steps"], 6)
        self.assertEqual(summary["max_lag"], 0)
        self.assertEqual(summary["mean_lag"], 0)

    def test_a_killed_actor_is_restarted_and_the_run_completes(self):
        # Long enough (a step takes ~0.1 s here) that the kill lands well before the end.
        proc = self.start(self.config(learner={"steps": 150}))
        self.wait_for(r"step +2/150")
        pids = subprocess.run(["pgrep", "-f", "actor --config .*--name actor-0"],
                              capture_output=True, text=True).stdout.split()
        self.assertTrue(pids, self.output())
        os.kill(int(pids[0]), signal.SIGKILL)
        summary = self.finish(proc)
        self.assertIn("supervisor: actor-0 killed by signal 9", self.output())
        self.assertGreaterEqual(summary["restarts"]["actor"], 1)
        self.assertEqual(summary["steps"], 150)

    def test_ctrl_c_stops_every_role_and_removes_shared_memory(self):
        proc = self.start(self.config(learner={"steps": 1000}))
        self.wait_for(r"step +1/1000")
        self.assertTrue(glob.glob("/dev/shm/prl-%s-*" % self.name))
        proc.send_signal(signal.SIGINT)
        self.assertEqual(proc.wait(timeout=120), 130, self.output())
        self.assertIn("interrupted", self.output())
        self.assertEqual(glob.glob("/dev/shm/prl-%s-*" % self.name), [])
        left = subprocess.run(["pgrep", "-f", "--config %s" % re.escape(
            os.path.join(self.tmp, "run", "config.json"))], capture_output=True, text=True)
        self.assertEqual(left.stdout.strip(), "", "roles outlived prl run")

    def test_every_role_serves_metrics_that_promtool_accepts(self):
        proc = self.start(self.config(learner={"steps": 1000}))
        self.wait_for(r"step +2/1000")
        endpoints = re.findall(r"metrics: (\S+) (http://\S+)", self.output())
        self.assertEqual([e[0] for e in endpoints],
                         ["coordinator", "learner", "actor-0", "actor-1"])
        # What each role must show once it has done some work. An actor that started late (a
        # loaded machine) may not have generated by step 2: scrape until it has.
        expected = {
            "coordinator": [r"prl_prompts_in_flight"],
            "learner": [r"prl_sample_max_lag_versions_count [1-9]", r"prl_importance_ratio_mean",
                        r"prl_logprob_mismatch_kl"],
            "actor-0": [r"prl_rollout_length_tokens_count [1-9]",
                        r"prl_tokens_generated_total [1-9]"],
            "actor-1": [r"prl_rollout_length_tokens_count [1-9]",
                        r"prl_tokens_generated_total [1-9]"],
        }
        bodies = {}
        deadline = time.time() + 120
        for role, url in endpoints:
            while True:
                bodies[role] = urllib.request.urlopen(url, timeout=10).read().decode()
                if all(re.search(p, bodies[role]) for p in expected[role]) \
                        or time.time() > deadline:
                    break
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        for role, patterns in expected.items():
            for pattern in patterns:
                self.assertRegex(bodies[role], pattern, role)
        promtool = shutil.which("promtool")
        if promtool is None:
            self.skipTest("promtool not installed (scripts/setup.sh installs it)")
        for role, body in bodies.items():
            check = subprocess.run([promtool, "check", "metrics"], input=body,
                                   capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, "%s: %s%s" % (role, check.stdout, check.stderr))
            self.assertEqual(check.stdout.strip(), "", "%s: %s" % (role, check.stdout))

    def test_a_cuda_setting_this_machine_cannot_honour_fails_at_once(self):
        if os.path.exists("/dev/nvidia0"):
            self.skipTest("this machine has a GPU: learner.device = cuda would run")
        cuda_build = "built without CUDA" not in subprocess.run(
            [PRL, "--version"], capture_output=True, text=True).stdout
        for key in ("learner.device", "actors.device"):
            start = time.time()
            proc = subprocess.run([PRL, "run", "--config", self.config(), "--set", key + "=cuda"],
                                  capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 1, proc.stdout)
            self.assertLess(time.time() - start, 20, "failed at once, not after the warm-start")
            self.assertIn("%s = cuda" % key, proc.stderr)
            # A CPU-only build names the build option; a CUDA build says no GPU is visible.
            self.assertIn("usable CUDA GPU" if cuda_build else "-DPRL_CUDA=ON", proc.stderr)
            self.assertNotIn("warm-start:", proc.stdout)

    def test_a_checkpoint_dir_outside_the_run_is_never_deleted(self):
        # Without --resume, prl run starts afresh by removing what an earlier run left in its
        # run directory; a checkpoint directory elsewhere that holds files is not its to
        # delete: the run refuses at once, naming the key, and the files stay.
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.makedirs(os.path.join(elsewhere, "step_000010"))
        with open(os.path.join(elsewhere, "step_000010", "keep.me"), "w") as f:
            f.write("someone else's checkpoint\n")
        proc = subprocess.run(
            [PRL, "run", "--config", self.config(learner={"checkpoint_dir": elsewhere})],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("learner.checkpoint_dir", proc.stderr)
        self.assertIn("outside the run directory", proc.stderr)
        self.assertTrue(os.path.exists(os.path.join(elsewhere, "step_000010", "keep.me")))
        self.assertNotIn("warm-start:", proc.stdout)

    def test_a_misspelt_enumeration_lists_the_accepted_values(self):
        proc = subprocess.run([PRL, "run", "--set", "learner.advantage=grpoo"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("learner.advantage: expected one of grpo, dr_grpo; found 'grpoo'",
                      proc.stderr)

    def test_a_bad_config_is_refused_naming_the_field(self):
        proc = subprocess.run([PRL, "run", "--config", self.config(learner={"lr": -1})],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("learner.lr: expected a number > 0, found -1", proc.stderr)
        proc = subprocess.run([PRL, "run", "--set", "actors.cuont=2"], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("unknown key 'actors.cuont'", proc.stderr)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
