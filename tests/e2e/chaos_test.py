#!/usr/bin/python3
"""Chaos: kill -9 of any process loses nothing that was accepted, and the run goes on.

The pipeline as separate processes on loopback (coordinator, learner, replay ingest, two
actors pushing through the ingest), each from one config file. Two kills are aimed at the
windows exactly-once rests on (core/test_hooks.h: the process stops at a fault point and is
killed there): an actor that wrote a group to the replay buffer before the coordinator heard
of its completion (the prompt runs again: a duplicate group), and a learner that journaled a
step and acknowledged its groups before the checkpoint covering it. Then a seeded supervisor
kills a random role with SIGKILL at random moments and starts it again with the same command
line.
Exactly learner.steps x learner.groups_per_step prompts are submitted, so the learner
reaches its step count only if every prompt is trained: all but the last step's worth at the
start, the rest once every kill has happened (so no run ends before its kills). At the end, from the final
checkpoint's ledger (learner/prompt_ledger.h) and the coordinator's status, every accepted
prompt is trained exactly once in the final checkpoint's lineage or visibly failed, and the
accounting is printed. An oracle apart from the learner's ledger: every group the actors wrote
(a tap, core/test_hooks.h) against the coordinator's completed prompts shows that duplicate
groups reached the replay buffer, and the ledger that none was trained twice.

usage: chaos_test.py PATH_TO_PRL [unittest args]
env: PRL_CHAOS_SEEDS (default "1,2,3,4,5,6,7,8,9,10"): the seeds run, one run each;
     PRL_CHAOS_KEEP: a directory each run's work directory is copied into
"""
import collections
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
STEPS, GROUPS_PER_STEP = 30, 4
PROMPTS = STEPS * GROUPS_PER_STEP
KILLS_PER_RUN = 8


class ChaosRun:
    """One seeded run: the roles, the kills, and the accounting."""

    def __init__(self, root, model, prompts, seed):
        """`prompts`: the two prompt files (submitted at the start and after the kills)."""
        self.seed = seed
        self.tag = "chaos-%d-%d" % (os.getpid(), seed)
        self.work = os.path.join(root, self.tag)
        os.makedirs(self.work)
        self.port = free_port()
        self.prompts = prompts
        self.procs, self.commands = {}, {}
        self.kills = collections.Counter()
        self.taps = os.path.join(self.work, "taps")
        os.makedirs(self.taps)
        ingest = "127.0.0.1:%d" % free_port()
        cfg = {
            "run": {"name": self.tag, "dir": self.work},
            "model": {"path": model},
            # max_attempts: the default (3), as a user runs it.
            "coordinator": {"listen": "127.0.0.1:%d" % self.port, "lease_ms": 1500,
                            "heartbeat_ms": 300},
            "learner": {"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "lr": 1e-3,
                        "checkpoint_every": 3, "max_lag": 2,
                        "report_file": os.path.join(self.work, "steps.jsonl")},
            "actors": {"max_prompts_in_flight": 2, "kv_cache_mb": 16},
            "replay": {"capacity_mb": 24, "listen": ingest, "address": ingest,
                       "lease_ms": 3000},
        }
        self.config = os.path.join(self.work, "config.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)

    def start(self, name, *args, fault_point=None):
        """Starts a role; with `fault_point` it stops there (core/test_hooks.h)."""
        self.commands[name] = [PRL, *map(str, args)]
        env = dict(os.environ, PRL_TEST_TAP_DIR=self.taps)
        if fault_point:
            env["PRL_FAULT_POINT"] = fault_point
        log = open(os.path.join(self.work, name + ".log"), "a")
        self.procs[name] = subprocess.Popen(self.commands[name], stdout=log,
                                            stderr=subprocess.STDOUT, text=True, env=env)
        log.close()

    def kill_at(self, name, point, timeout=120):
        """Waits for `name` to stop at its fault point, kills it there (SIGKILL), restarts it."""
        marker = "prl fault point reached: " + re.escape(point)
        if not self.wait_for(name, marker, timeout):
            raise AssertionError("%s never reached %s:\n%s" % (name, point, self.log(name)[-3000:]))
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        self.kills["%s@%s" % (name, point)] += 1
        self.start(name, *self.commands[name][1:])

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def wait_for(self, name, pattern, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log(name)):
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        run("replay", "reset", "prl-%s-replay" % self.tag, "--force")
        if os.path.exists("/dev/shm/prl-%s-weights" % self.tag):
            os.remove("/dev/shm/prl-%s-weights" % self.tag)

    def status(self, set_id):
        proc = run("status", set_id, "--server", "127.0.0.1:%d" % self.port, "--json")
        return json.loads(proc.stdout)[0] if proc.returncode == 0 else None

    def submit(self, part):
        deadline = time.time() + 30
        while True:  # the coordinator may be restarting
            proc = run("submit", self.prompts[part], "--server", "127.0.0.1:%d" % self.port,
                       "--samples", 4, "--max-tokens", 4, "--stop-token", 2, "--reward",
                       "arithmetic", "--idempotency-key", "%s-%d" % (self.tag, part), "--json")
            if proc.returncode == 0:
                return json.loads(proc.stdout.splitlines()[0])["prompt_set_id"]
            if time.time() > deadline:
                raise AssertionError("submit failed:\n" + proc.stderr)
            time.sleep(0.2)

    def go(self, timeout=300):
        """Runs to the learner's last step under kills; returns whether it got there."""
        self.start("coordinator", "coordinator", "--config", self.config)
        if not self.wait_for("coordinator", r"coordinator on port %d" % self.port):
            raise AssertionError("the coordinator did not start:\n" + self.log("coordinator"))
        self.start("learner", "learner", "serve", "--config", self.config,
                   fault_point="learner.after_journal_write")
        self.start("replay", "replay", "serve", "--config", self.config)
        self.start("a0", "actor", "--config", self.config, "--name", "a0",
                   fault_point="actor.after_replay_write")
        self.set_ids = [self.submit(0)]
        # The aimed kills first: the windows the dedup must cover, each hit for sure. a1 starts
        # only once a0 has written a group: the learner waits at its own fault point meanwhile,
        # and an a1 that leased the whole lag budget first would leave a0 nothing to write.
        self.kill_at("a0", "actor.after_replay_write")
        self.start("a1", "actor", "--config", self.config, "--name", "a1")
        self.kill_at("learner", "learner.after_journal_write")
        rng = random.Random(self.seed)
        deadline = time.time() + timeout
        next_kill = time.time() + rng.uniform(0.5, 1.5)
        while time.time() < deadline:
            learner = self.procs["learner"]
            if learner.poll() == 0:
                return True
            if learner.poll() is not None:  # it died by itself: that is a failure
                return False
            for name, p in self.procs.items():
                if name != "learner" and p.poll() is not None:
                    raise AssertionError("%s exited by itself (%d):\n%s" % (
                        name, p.returncode, self.log(name)[-3000:]))
            if self.random_kills() < KILLS_PER_RUN and time.time() >= next_kill:
                victim = rng.choice(["coordinator", "learner", "replay", "a0", "a1"])
                self.procs[victim].send_signal(signal.SIGKILL)
                self.procs[victim].wait()
                self.kills[victim] += 1
                time.sleep(rng.uniform(0.0, 0.5))
                self.start(victim, *self.commands[victim][1:])
                next_kill = time.time() + rng.uniform(0.3, 1.2)
                if self.random_kills() == KILLS_PER_RUN:
                    self.set_ids.append(self.submit(1))
            time.sleep(0.05)
        return False

    def random_kills(self):
        return sum(n for name, n in self.kills.items() if "@" not in name)

    def written_groups(self):
        """The groups the actors wrote to the replay buffer (their tap): (set, index, group)."""
        groups = set()
        path = os.path.join(self.taps, "actor_groups_written.tap")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    if len(fields) == 3:
                        groups.add((fields[0], int(fields[1]), fields[2]))
        return groups

    def admissions(self):
        """What the learner decided about each taken group (its tap): prompt key -> decisions."""
        decisions = collections.defaultdict(list)
        path = os.path.join(self.taps, "learner_admission.tap")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")  # decision, group key, set, index
                    if len(fields) >= 3:
                        decisions[":".join(fields[2:])].append(fields[0])
        return decisions

    def untrained(self, accepted, trained, failed):
        """The accepted prompts neither trained nor failed, each with what the actors wrote for
        it and what the learner decided about those groups: for a post-mortem."""
        written = collections.Counter((s, i) for s, i, _ in self.written_groups())
        decisions = self.admissions()
        return ["%s:%d written %d, learner %s" % (s, i, written[(s, i)],
                                                    decisions.get("%s:%d" % (s, i), []))
                for s, i in accepted if trained[(s, i)] == 0 and (s, i) not in failed]

    def accounting(self):
        """(trained count per prompt, failed prompts, the printed table); prompts are
        (set id, index) pairs."""
        ledger = os.path.join(self.work, "checkpoints", "step-%08d" % STEPS, "trained_prompts.tsv")
        trained = collections.Counter()
        if os.path.exists(ledger):
            with open(ledger) as f:
                for line in f:
                    _, set_id, index = line.rstrip("\n").split("\t")
                    trained[(set_id, int(index))] += 1
        accepted, failed, done = [], set(), 0
        for set_id in self.set_ids:
            status = self.status(set_id) or {}
            accepted += [(set_id, i) for i in range(status.get("prompts_total", 0))]
            failed |= {(set_id, p["prompt_index"]) for p in status.get("failed_prompts", [])}
            done += status.get("prompts_done", 0)
        written = self.written_groups()
        written_prompts = {(s, i) for s, i, _ in written}
        duplicates = stale = 0
        if os.path.exists(os.path.join(self.work, "steps.jsonl")):
            with open(os.path.join(self.work, "steps.jsonl")) as f:
                for line in f:  # each line counts its own step's
                    r = json.loads(line)
                    duplicates += r["duplicate_groups"]
                    stale += r["stale_requeued"]
        table = ("seed %d: kills %s; %d prompts accepted in %d sets: %d trained once, %d trained "
                 "more than once, %d failed, %d neither; %d ledger entries of no accepted prompt; "
                 "duplicate groups acknowledged untrained %d, stale groups handed back %d; "
                 "oracle: %d groups written by the actors for %d prompts, %d completed at the "
                 "coordinator" % (
                     self.seed, dict(sorted(self.kills.items())), len(accepted), len(self.set_ids),
                     sum(1 for p in accepted if trained[p] == 1),
                     sum(1 for p in accepted if trained[p] > 1), len(failed),
                     sum(1 for p in accepted if trained[p] == 0 and p not in failed),
                     sum(n for p, n in trained.items() if p not in set(accepted)),
                     duplicates, stale, len(written), len(written_prompts), done))
        self.oracle = {"written": written, "written_prompts": written_prompts, "done": done}
        return accepted, trained, failed, table


class ChaosTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_chaos_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        tiny_model(cls.model)
        rng = random.Random(3)
        cls.prompts = [os.path.join(cls.dir, "prompts-%d.jsonl" % i) for i in (0, 1)]
        for path, count in zip(cls.prompts, (PROMPTS - GROUPS_PER_STEP, GROUPS_PER_STEP)):
            arithmetic_prompts(path, count, rng)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_accepted_prompt_is_trained_exactly_once_or_failed_under_kills(self):
        seeds = [int(s) for s in os.environ.get("PRL_CHAOS_SEEDS",
                                                "1,2,3,4,5,6,7,8,9,10").split(",")]
        for seed in seeds:
            with self.subTest(seed=seed):
                chaos = ChaosRun(self.dir, self.model, self.prompts, seed)
                try:
                    finished = chaos.go()
                    accepted, trained, failed, table = chaos.accounting()
                    print(table, flush=True)
                    logs = "\n".join("--- %s\n%s" % (n, chaos.log(n)[-2500:])
                                     for n in ("learner", "coordinator", "replay", "a0"))
                    self.assertTrue(finished, "the learner did not reach step %d:\n%s\n%s\n%s" % (
                        STEPS, table, "\n".join(chaos.untrained(accepted, trained, failed)),
                        logs))
                    self.assertEqual(chaos.random_kills(), KILLS_PER_RUN, table)
                    # The oracle: more groups reached the replay buffer than prompts completed
                    # (the aimed actor kill made one at least), yet none was trained twice
                    # (below), and everything trained was written by an actor.
                    oracle = chaos.oracle
                    self.assertGreater(len(oracle["written"]), oracle["done"],
                                       "no duplicate group reached the replay buffer\n" + table)
                    for p in trained:
                        self.assertIn(p, oracle["written_prompts"],
                                      "prompt %s trained but never written\n%s" % (p, table))
                    self.assertEqual(len(accepted), PROMPTS, table)
                    for p in accepted:
                        self.assertLessEqual(trained[p], 1, "prompt %s trained %d times\n%s" % (
                            p, trained[p], table))
                        self.assertTrue(trained[p] == 1 or p in failed,
                                        "prompt %s neither trained nor failed\n%s" % (p, table))
                    self.assertEqual(sum(trained.values()), STEPS * GROUPS_PER_STEP, table)
                finally:
                    chaos.stop()
                    keep = os.environ.get("PRL_CHAOS_KEEP")
                    if keep:  # the run's logs, config and checkpoints, for a post-mortem
                        subprocess.run(["cp", "-r", chaos.work, keep], check=False)


if __name__ == "__main__":
    PRL = e2e_util.PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
