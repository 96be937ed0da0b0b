#!/usr/bin/python3
"""The pipeline as separate processes on loopback, each role started from the same config file
and nothing else (`prl coordinator --config F`, `prl learner serve --config F`, `prl actor
--config F`), driven by `prl submit`. Every role takes the file's settings and prints the same
effective config as `prl run`; a submitted prompt set completes; an actor killed with kill -9
mid-run loses no prompt; a learner killed and restarted resumes from its checkpoint; the
learner's lag reflects the weight versions the actors generated with.

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

import e2e_util
from e2e_util import arithmetic_prompts, free_port, run, tiny_model

PRL = None


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_pipeline_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        tiny_model(cls.model)
        cls.prompts = os.path.join(cls.dir, "prompts.jsonl")
        arithmetic_prompts(cls.prompts, 24, random.Random(3))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.tag = "e2e-%d-%s" % (os.getpid(), self.id().split(".")[-1][:20])
        self.work = os.path.join(self.dir, self.tag)
        os.makedirs(self.work)
        self.procs = {}
        self.port = free_port()

    def tearDown(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        run("replay", "reset", "prl-%s-replay" % self.tag, "--force")
        if os.path.exists("/dev/shm/prl-%s-weights" % self.tag):
            os.remove("/dev/shm/prl-%s-weights" % self.tag)

    def config(self, **sections):
        """The run's one config file: these tests' settings, all off the defaults."""
        cfg = {
            "run": {"name": self.tag, "dir": self.work},
            "model": {"path": self.model},
            "coordinator": {"listen": "127.0.0.1:%d" % self.port, "lease_ms": 1500,
                            "heartbeat_ms": 300},
            "learner": {"steps": 0, "groups_per_step": 4, "lr": 1e-3, "checkpoint_every": 1,
                        "max_lag": 8, "report_file": os.path.join(self.work, "steps.jsonl")},
            "actors": {"max_prompts_in_flight": 2, "kv_cache_mb": 16},
            "replay": {"capacity_mb": 24},
        }
        for section, values in sections.items():
            cfg.setdefault(section, {}).update(values)
        path = os.path.join(self.work, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def start(self, name, *args):
        log = open(os.path.join(self.work, name + ".log"), "w")
        self.procs[name] = subprocess.Popen([PRL, *map(str, args)], stdout=log,
                                            stderr=subprocess.STDOUT, text=True)
        log.close()

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def start_roles(self, config, actors=("a0",)):
        self.start("coordinator", "coordinator", "--config", config)
        self.wait_for("coordinator", r"coordinator on port %d" % self.port)
        self.start("learner", "learner", "serve", "--config", config)
        for name in actors:
            self.start(name, "actor", "--config", config, "--name", name)

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

    def test_every_role_takes_its_settings_from_one_config_file(self):
        config = self.config(
            coordinator={"lease_ms": 4321, "heartbeat_ms": 321},
            learner={"steps": 3, "groups_per_step": 3, "lr": 0.000321, "loss": "ppo_clip",
                     "advantage": "dr_grpo", "max_lag": 2, "checkpoint_every": 2},
            actors={"kv_cache_mb": 48, "block_size": 8, "max_num_seqs": 12,
                    "max_prompts_in_flight": 3},
            broadcast={"transport": "grpc", "listen": "127.0.0.1:%d" % free_port()},
            metrics={"listen": "127.0.0.1:0"})
        self.start("coordinator", "coordinator", "--config", config)
        self.wait_for("coordinator", r"coordinator on port %d" % self.port)
        self.start("learner", "learner", "serve", "--config", config)
        self.start("actor0", "actor", "--config", config)
        self.start("actor1", "actor", "--config", config)
        self.submit()
        self.assertEqual(self.procs["learner"].wait(timeout=300), 0, self.log("learner"))
        self.assertIn("leases of 4321 ms renewed every 321 ms, budget (2 + 1) x 3 groups",
                      self.log("coordinator"))
        learner = self.log("learner")
        self.assertIn("ppo_clip loss, dr_grpo advantages, adamw lr 0.000321, 3 groups per step, "
                      "max lag 2; replay prl-%s-replay (24 MiB); weights over gRPC" % self.tag,
                      learner)
        for actor in ("actor0", "actor1"):
            self.wait_for(actor, r"generating for 127.0.0.1:%d .*KV cache 48 MiB in blocks of "
                                 r"8, 12 sequences, 3 prompts in flight" % self.port)
        names = {re.search(r"actor (\S+): generating", self.log(a)).group(1)
                 for a in ("actor0", "actor1")}
        self.assertEqual(len(names), 2, "actors started without --name get distinct names")
        # The learner took exactly learner.steps steps of groups_per_step groups each, reported
        # them to learner.report_file and checkpointed every 2 steps and after the last (the
        # journal of steps since the last checkpoint is empty).
        with open(os.path.join(self.work, "steps.jsonl")) as f:
            steps = [json.loads(line) for line in f]
        self.assertEqual([s["step"] for s in steps], [1, 2, 3])
        self.assertEqual({s["groups"] for s in steps}, {3})
        self.assertEqual({s["lr"] for s in steps}, {0.000321})
        # keep_checkpoints 2 (beside them: latest, the learner's journal and the grpc
        # transport's newest published version, weight_broadcast/version_file.h)
        kept = os.listdir(os.path.join(self.work, "checkpoints"))
        self.assertEqual(sorted(n for n in kept if n.startswith("step-")),
                         ["step-00000002", "step-00000003"])
        self.assertIn("weight_version", kept)
        self.assertEqual(os.listdir(os.path.join(self.work, "checkpoints", "journal")), [])

    def test_every_role_prints_the_same_effective_config_as_prl_run(self):
        config = self.config(learner={"lr": 0.125, "loss": "cispo"},
                             actors={"device": "cpu", "kv_cache_mb": 7})
        expected = run("run", "--config", config, "--print-config", check=True).stdout
        self.assertIn('"lr": 0.125', expected)
        for role in (["coordinator"], ["actor"], ["learner", "serve"], ["replay", "serve"],
                     ["reward", "serve"],
                     ["replay", "create"], ["learner", "train", "--rollouts", "x"],
                     ["learner", "step", "--rollouts", "x", "--out", "y"]):
            printed = run(*role, "--config", config, "--print-config", check=True).stdout
            self.assertEqual(printed, expected, " ".join(role))
        # A shorthand flag is the key of the same name.
        printed = run("actor", "--config", config, "--kv-cache-mb", 9, "--print-config",
                      check=True).stdout
        self.assertEqual(printed, expected.replace('"kv_cache_mb": 7', '"kv_cache_mb": 9'))

    def test_a_misspelt_setting_names_the_key_and_the_accepted_values(self):
        config = self.config()
        for role in (["coordinator"], ["actor"], ["learner", "serve"]):
            proc = run(*role, "--config", config, "--set", "learner.advantage=grpoo")
            self.assertEqual(proc.returncode, 1)
            self.assertIn("learner.advantage: expected one of grpo, dr_grpo; found 'grpoo'",
                          proc.stderr)
        proc = run("actor", "--config", config, "--device", "gpu")
        self.assertIn("actors.device: expected one of cpu, cuda; found 'gpu'", proc.stderr)

    def test_a_submitted_set_completes_and_the_learner_trains_on_it(self):
        self.start_roles(self.config())
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
        self.start_roles(self.config(), actors=("a0", "a1"))
        set_id = self.submit()
        deadline = time.time() + 120
        while self.status(set_id)["prompts_done"] < 4 and time.time() < deadline:
            time.sleep(0.05)
        self.procs["a0"].send_signal(signal.SIGKILL)
        status = self.wait_done(set_id)
        self.assertEqual(status["prompts_done"], 24)
        self.assertEqual(status["prompts_in_flight"], 0)

    def test_a_killed_learner_resumes_from_its_checkpoint(self):
        config = self.config()
        self.start_roles(config)
        set_id = self.submit()
        self.wait_for("learner", r"step 2: version 2")
        self.procs["learner"].send_signal(signal.SIGKILL)
        self.procs["learner"].wait()
        self.start("learner2", "learner", "serve", "--config", config)
        self.wait_for("learner2", r"learner: resumed from .* at step [2-9]")
        resumed = int(re.search(r"at step (\d+)", self.log("learner2")).group(1))
        self.wait_done(set_id)
        # New work trains on: the steps continue from the checkpoint, not from zero.
        self.wait_done(self.submit())
        self.wait_for("learner2", r"step %d: version" % (resumed + 1))
        self.assertNotIn("step 1: version 1,", self.log("learner2"))

    def test_the_run_finishes_when_the_learner_and_then_the_coordinator_are_killed(self):
        # A small lag budget (2 steps of 4 groups) and a checkpoint every 4 steps: the learner
        # restarts from its journal and the coordinator from its log, and the budget, which
        # both sides' restarts used to stall, lets every prompt through to training.
        config = self.config(learner={"checkpoint_every": 4, "max_lag": 1})
        self.start_roles(config, actors=("a0", "a1"))
        set_id = self.submit()
        self.wait_for("learner", r"step 2: version 2")
        self.procs["learner"].send_signal(signal.SIGKILL)
        self.procs["learner"].wait()
        self.start("learner2", "learner", "serve", "--config", config)
        self.wait_for("learner2", r"step \d+: version")
        self.procs["coordinator"].send_signal(signal.SIGKILL)
        self.procs["coordinator"].wait()
        self.start("coordinator2", "coordinator", "--config", config)
        self.wait_for("coordinator2", r"coordinator on port %d" % self.port)
        self.wait_done(set_id)
        trained = len(re.findall(r"^step \d+: version", self.log("learner2"), re.M))
        # 24 more prompts, three times the budget: done only if the budget keeps moving.
        self.wait_done(self.submit())
        deadline = time.time() + 120
        while len(re.findall(r"^step \d+: version", self.log("learner2"), re.M)) <= trained:
            self.assertLess(time.time(), deadline, "no step after the coordinator's restart")
            time.sleep(0.2)
        steps = re.findall(r"^step (\d+): version", self.log("learner2"), re.M)
        self.assertEqual(len(steps), len(set(steps)), "a step trained twice:\n" + self.log("learner2"))


if __name__ == "__main__":
    PRL = e2e_util.PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
