#!/usr/bin/python3
"""`prl run` with agentic episodes against prl's built-in environments (docs/environments.md),
from the example configs users start from (examples/calculator_run.json,
examples/guess_number_run.json), on the tiny model with the character tokenizer:

- calculator: held-out success rises by at least 0.2 and the tool-use rate (held-out episodes
  that call the calculator) rises by at least 0.2; the training curve's tool-use share rises.
  Measured: 0.472 -> 0.976, tool use 0.228 -> 1.000.
- guess_number: held-out success (the share of the secrets 1..50 found within 6 guesses)
  rises by at least 0.2. Measured: 0.600 -> 1.000.
- Every trained episode's tokens: the warm-start's demonstrations mark the environment's
  tokens (sources 1) that the learner never trains.

The learning runs (`*_is_learned*`, ctest `e2e.env_learning`, label `learning`) are the examples
as users run them, 1000 warm-start and 400 RL steps each (about 6 minutes on 2 cores): learning
curves, run on demand (docs/development.md, "Learning runs"), not in every CI run. What every run
checks (`*_runs_*`, ctest `e2e.env_run`) is each example's whole path on a few steps: the
environment named, its episodes run and reported, the demonstrations' sources.

usage: env_run_test.py PATH_TO_PRL [unittest args]
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRL = None


class EnvRunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="prl_env_run_test_")
        self.name = "t%d-%s" % (os.getpid(), self.id().split(".")[-1][-12:])

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        for path in glob.glob("/dev/shm/prl-%s-*" % self.name):
            os.remove(path)

    def run_example(self, example, *settings):
        run_dir = os.path.join(self.tmp, "run")
        sets = [arg for setting in settings for arg in ("--set", setting)]
        out = subprocess.run(
            [PRL, "run", "--config", os.path.join(ROOT, "examples", example),
             "--set", 'run.name="%s"' % self.name, "--set", 'run.dir="%s"' % run_dir,
             "--set", 'coordinator.listen="127.0.0.1:0"',
             "--set", 'broadcast.listen="127.0.0.1:0"', *sets],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
        self.assertEqual(out.returncode, 0, out.stdout[-5000:])
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        return summary, run_dir, out.stdout

    # A few steps of each example: what every CI run checks.
    SHORT = ("sft.steps=100", "learner.steps=4", "task.eval_prompts=20")

    def check_demonstrations(self, run_dir):
        # The demonstrations: some call the tool, the tool's reply is the environment's.
        with open(os.path.join(run_dir, "sft.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        calls = [l for l in lines if 1 in l.get("sources", [])]
        self.assertTrue(0.2 < len(calls) / len(lines) < 0.4, len(calls) / len(lines))
        for line in calls[:50]:
            self.assertEqual(len(line["sources"]), len(line["completion"]))
            self.assertEqual(line["sources"][0], 0)   # the model's call
            self.assertEqual(line["sources"][-1], 0)  # the model's answer and its stop

    def test_the_calculator_example_runs_its_environment(self):
        summary, run_dir, out = self.run_example("calculator_run.json", *self.SHORT)
        self.assertEqual(summary["environment"], "calculator")
        self.assertEqual(summary["steps"], 4)
        self.assertEqual(summary["eval_prompts"], 20)
        self.assertIn("calculator episodes:", out)
        self.check_demonstrations(run_dir)

    def test_the_guessing_game_example_runs_its_environment(self):
        summary, _, out = self.run_example("guess_number_run.json", *self.SHORT)
        self.assertEqual(summary["environment"], "guess_number")
        self.assertEqual(summary["steps"], 4)
        self.assertEqual(summary["eval_prompts"], 20)
        self.assertIn("guess_number episodes:", out)

    def test_the_calculator_is_learned_and_used_more(self):
        summary, run_dir, out = self.run_example("calculator_run.json")
        report = "held-out %.3f -> %.3f, tool use %.3f -> %.3f" % (
            summary["eval_before"], summary["eval_after"], summary["eval_multi_turn_before"],
            summary["eval_multi_turn_after"])
        print(report)
        self.assertEqual(summary["environment"], "calculator")
        self.assertGreaterEqual(summary["eval_after"] - summary["eval_before"], 0.2, report)
        self.assertGreaterEqual(
            summary["eval_multi_turn_after"] - summary["eval_multi_turn_before"], 0.2, report)
        curve = [p["multi_turn_fraction"] for p in summary["reward_curve"]]
        self.assertGreater(sum(curve[-20:]) / 20, sum(curve[:5]) / 5 + 0.2, curve[:5] + curve[-20:])
        self.assertIn("calculator episodes:", out)
        self.check_demonstrations(run_dir)

    def test_the_guessing_game_is_learned(self):
        summary, _, out = self.run_example("guess_number_run.json")
        report = "held-out %.3f -> %.3f, turns %.2f -> %.2f" % (
            summary["eval_before"], summary["eval_after"], summary["eval_turns_before"],
            summary["eval_turns_after"])
        print(report)
        self.assertEqual(summary["environment"], "guess_number")
        self.assertEqual(summary["eval_prompts"], 50)
        self.assertGreaterEqual(summary["eval_after"] - summary["eval_before"], 0.2, report)
        self.assertIn("guess_number episodes:", out)


if __name__ == "__main__":
    PRL = sys.argv.pop(1)
    unittest.main()
