#!/usr/bin/python3
"""A run a user can copy whose sequences exceed one learner rank's activation budget
(examples/long_tool_output_run.json, docs/learner.md "A run to copy"): the built-in calculator
answers each call with a long trace (env.params.output_chars), so an episode that calls the tool
is several hundred tokens, and the learner trains it on 2 ranks with context parallelism 2 and
full activation checkpointing under learner.activation_budget_mb.

- `*_runs_*` (ctest e2e.long_context_run, every CI run): a few steps of the example train its
  long episodes on 2 ranks (every step's peak pass workspace within the budget), and the same
  warm-started model on 1 rank without checkpointing or context parallelism refuses them: the
  learner dead-letters their groups (reason `context`), naming the settings that would fit.
- `*_is_learned*` (ctest e2e.long_context_learning, label `learning`): the example as users run
  it; held-out success and tool use rise by at least 0.2. Measured: 0.388 -> 0.818, tool use
  0.226 -> 1.000, 660 s on 2 cores (the short test: 112 s).

usage: long_context_run_test.py PATH_TO_PRL [unittest args]
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "long_tool_output_run.json")
PRL = None


class LongContextRunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="prl_long_context_test_")
        self.name = "t%d-%s" % (os.getpid(), self.id().split(".")[-1][-12:])
        with open(EXAMPLE) as f:
            self.example = json.load(f)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        for path in glob.glob("/dev/shm/prl-%s-*" % self.name):
            os.remove(path)

    def command(self, run_dir, settings):
        sets = [arg for setting in settings for arg in ("--set", setting)]
        return [PRL, "run", "--config", EXAMPLE,
                "--set", 'run.name="%s"' % self.name, "--set", 'run.dir="%s"' % run_dir,
                "--set", 'coordinator.listen="127.0.0.1:0"',
                "--set", 'broadcast.listen="127.0.0.1:0"', *sets]

    def run_example(self, run_dir, *settings):
        out = subprocess.run(self.command(run_dir, settings), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=3000)
        self.assertEqual(out.returncode, 0, out.stdout[-5000:])
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "learner_steps.jsonl")) as f:
            steps = [json.loads(line) for line in f if line.strip()]
        return summary, steps, out.stdout

    # A few steps: what every CI run checks. The warm-start demonstrates the call in every
    # example, so that the short warm-start's model calls the tool and its episodes are long.
    SHORT = ("sft.steps=60", "sft.env_demo_fraction=1", "learner.steps=4",
             "task.eval_prompts=20")

    def test_the_example_runs_its_long_episodes_on_two_ranks_and_one_rank_refuses_them(self):
        learner = self.example["learner"]
        self.assertEqual((learner["world_size"], learner["context_parallel"],
                          learner["activation_checkpointing"]), (2, 2, "full"))
        budget = learner["activation_budget_mb"] << 20

        run_dir = os.path.join(self.tmp, "run")
        summary, steps, out = self.run_example(run_dir, *self.SHORT)
        self.assertEqual(summary["steps"], 4)
        self.assertIn("2 learner rank(s)", out)
        self.assertFalse(os.path.exists(os.path.join(run_dir, "dead_letters", "learner.jsonl")),
                         "the example's learner refused a group")
        for s in steps:
            self.assertLessEqual(s["peak_activation_bytes"], budget, s)
            # Episodes that called the tool: each holds a reply of output_chars tokens.
            self.assertGreater(s["multi_turn_fraction"], 0, s)

        # The same warm-started model on one rank, neither checkpointing nor context
        # parallelism: the learner refuses the tool-calling episodes before any pass.
        alone = os.path.join(self.tmp, "alone")
        log_path = os.path.join(self.tmp, "alone.out")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                self.command(alone, ('model.path="%s"' % os.path.join(run_dir, "model-sft"),
                                     "sft.steps=0", "task.eval_prompts=20",
                                     "learner.world_size=1", "learner.context_parallel=1",
                                     "learner.activation_checkpointing=none")),
                stdout=log, stderr=subprocess.STDOUT, text=True)
        dead_letters = os.path.join(alone, "dead_letters", "learner.jsonl")
        try:
            letter = self.wait_for_dead_letter(proc, dead_letters, log_path)
        finally:
            proc.send_signal(signal.SIGINT)  # prl run stops its roles on Ctrl-C
            proc.wait(timeout=120)
        self.assertEqual(letter["reason"], "context", letter)
        self.assertIn("prompt_tokens + .completion_tokens", letter["field"])
        for words in ("learner.activation_budget_mb = %d" % learner["activation_budget_mb"],
                      "learner.activation_checkpointing = none", "full fits",
                      "learner.context_parallel = 2 fits"):
            self.assertIn(words, letter["expected"])
        one_rank = int(re.match(r"at most (\d+) tokens", letter["expected"]).group(1))
        refused = int(letter["found"].split("= ")[-1])
        self.assertGreater(refused, one_rank)
        # Every episode that called the tool is longer than one rank fits: its reply alone is.
        reply = int(self.example["env"]["params"]["output_chars"])
        self.assertGreater(reply, one_rank)
        print("one rank without checkpointing fits %d tokens and refused a sequence of %d; the "
              "example trained its episodes (tool replies of %d tokens) on 2 ranks, peak %.2f of "
              "%d MiB" % (one_rank, refused, reply,
                          max(s["peak_activation_bytes"] for s in steps) / 2**20,
                          learner["activation_budget_mb"]), flush=True)
        print("dead letter: %s" % json.dumps(letter), flush=True)

    def wait_for_dead_letter(self, proc, path, log_path, timeout=600):
        """The first line of the learner's dead-letter file (each line is written whole, with
        one write(2)), or a failure once prl run exits or the time is up."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(path):
                with open(path) as f:
                    line = f.readline()
                if line.endswith("\n"):
                    return json.loads(line)
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        with open(log_path) as f:
            self.fail("no dead letter in %s:\n%s" % (path, f.read()[-5000:]))

    def test_the_long_tool_output_task_is_learned(self):
        run_dir = os.path.join(self.tmp, "run")
        start = time.time()
        summary, steps, out = self.run_example(run_dir)
        report = "held-out %.3f -> %.3f, tool use %.3f -> %.3f, %.0f s" % (
            summary["eval_before"], summary["eval_after"], summary["eval_multi_turn_before"],
            summary["eval_multi_turn_after"], time.time() - start)
        print(report, flush=True)
        self.assertFalse(os.path.exists(os.path.join(run_dir, "dead_letters", "learner.jsonl")),
                         "the example's learner refused a group")
        budget = self.example["learner"]["activation_budget_mb"] << 20
        self.assertLessEqual(max(s["peak_activation_bytes"] for s in steps), budget)
        self.assertGreaterEqual(summary["eval_after"] - summary["eval_before"], 0.2, report)
        self.assertGreaterEqual(
            summary["eval_multi_turn_after"] - summary["eval_multi_turn_before"], 0.2, report)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
