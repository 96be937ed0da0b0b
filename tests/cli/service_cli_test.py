#!/usr/bin/python3
"""Black-box tests of `prl coordinator`, `prl submit` and `prl status` as separate processes on
loopback: submissions are validated with errors naming the field, the service keeps working
after a bad one, and accepted prompt sets survive a kill -9 of the coordinator.

usage: service_cli_test.py PATH_TO_PRL [unittest args]
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest

PRL = None


def run(*args, check=False, timeout=120):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s" % (" ".join(map(str, args)),
                                                         proc.returncode, proc.stderr))
    return proc


class ServiceCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_service_cli_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 1, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 48, "--vocab-size", 22,
            "--max-position-embeddings", 32, "--seed", 1, "--out", cls.model, check=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.log = os.path.join(self.dir, "prompts-%s.log" % self.id().split(".")[-1])
        self.coordinator = None
        self.start()

    def tearDown(self):
        self.stop(signal.SIGKILL)

    def start(self):
        self.coordinator = subprocess.Popen(
            [PRL, "coordinator", "--model", self.model, "--log", self.log, "--listen",
             "127.0.0.1:0", "--max-pending-prompts", "50"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.coordinator.stdout.readline()
        match = re.search(r"on port (\d+)", line)
        self.assertIsNotNone(match, "no port in: %r %s" % (line, self.coordinator.stderr.read()
                                                           if self.coordinator.poll() else ""))
        self.server = "127.0.0.1:%s" % match.group(1)

    def stop(self, sig):
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.send_signal(sig)
            self.coordinator.wait(timeout=30)
        if self.coordinator is not None:
            self.coordinator.stdout.close()
            self.coordinator.stderr.close()

    def prompts(self, name, lines):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        return path

    def submit(self, path, *flags):
        return run("submit", path, "--server", self.server, "--max-tokens", 8, "--json", *flags)

    def test_every_service_command_has_help(self):
        for cmd in [["coordinator"], ["submit"], ["status"]]:
            proc = run(*cmd, "--help")
            self.assertEqual(proc.returncode, 0, cmd)
            self.assertIn("Usage", proc.stdout, cmd)

    def test_a_submitted_set_is_listed_with_its_prompts_pending(self):
        path = self.prompts("ok.jsonl", [{"text": "12+34=", "reference": "46"},
                                         {"tokens": [3, 4, 13, 5, 16]}])
        out = json.loads(self.submit(path, "--samples", 4, "--weight", 3).stdout)
        self.assertEqual(out["prompts"], 2)
        status = json.loads(run("status", "--server", self.server, "--json", check=True).stdout)
        self.assertEqual(len(status), 1)
        self.assertEqual(status[0]["prompt_set_id"], out["prompt_set_id"])
        self.assertEqual(status[0]["state"], "running")
        self.assertEqual(status[0]["prompts_pending"], 2)
        self.assertEqual(status[0]["samples_per_prompt"], 4)
        self.assertEqual(status[0]["weight"], 3)
        line = run("status", "--server", self.server, check=True).stdout
        self.assertIn("2 pending, weight 3,", line)

    def test_an_evaluation_set_shows_its_running_round(self):
        path = self.prompts("eval.jsonl", [{"text": "1+1=", "reference": "2"}])
        out = json.loads(self.submit(path, "--eval-every", 5, "--pass-reward", 0.5).stdout)
        status = json.loads(run("status", out["prompt_set_id"], "--server", self.server,
                                "--json", check=True).stdout)[0]
        self.assertEqual(status["eval_round_version"], 0)  # its first round runs at once
        self.assertEqual(status["eval_rounds"], [])
        self.assertEqual(status["prompts_pending"], 1)
        text = run("status", out["prompt_set_id"], "--server", self.server, check=True).stdout
        self.assertIn("eval round running, opened at version 0", text)

    def test_a_run_of_adapters_submits_lists_and_deletes_adapters(self):
        self.stop(signal.SIGKILL)
        self.log = os.path.join(self.dir, "prompts-adapters.log")
        self.coordinator = subprocess.Popen(
            [PRL, "coordinator", "--model", self.model, "--log", self.log, "--listen",
             "127.0.0.1:0", "--set", "coordinator.adapters=true", "--set",
             "learner.lora_rank=4", "--set", "learner.lora_targets=q_proj,v_proj"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.coordinator.stdout.readline()
        match = re.search(r"on port (\d+)", line)
        self.assertIsNotNone(match, "no port in: %r" % line)
        self.server = "127.0.0.1:%s" % match.group(1)
        path = self.prompts("adapter.jsonl", [{"text": "1+1=", "reference": "2"}])
        refused = self.submit(path)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("adapter.name", refused.stderr)
        out = json.loads(self.submit(path, "--adapter", "math", "--adapter-rank", 8).stdout)
        self.assertEqual(self.submit(path, "--adapter", "math").returncode, 0)
        other = self.submit(path, "--adapter", "math", "--adapter-rank", 2)
        self.assertEqual(other.returncode, 1)
        self.assertIn("adapter.rank: the adapter 'math' exists with rank 8, found 2", other.stderr)
        adapters = json.loads(run("adapter", "list", "--server", self.server, "--json",
                                  check=True).stdout)
        self.assertEqual(len(adapters), 1)
        self.assertEqual(adapters[0]["name"], "math")
        self.assertEqual(adapters[0]["rank"], 8)
        self.assertEqual(adapters[0]["target_modules"], "q_proj,v_proj")  # the run's default
        self.assertEqual(adapters[0]["prompt_sets_running"], 2)
        self.assertIn("adapter math", run("status", out["prompt_set_id"], "--server",
                                          self.server, check=True).stdout)
        deleted = run("adapter", "delete", "math", "--server", self.server, check=True).stdout
        self.assertIn("2 running prompt sets cancelled", deleted)
        self.assertEqual(json.loads(run("adapter", "list", "--server", self.server, "--json",
                                        check=True).stdout), [])
        gone = run("adapter", "delete", "math", "--server", self.server)
        self.assertEqual(gone.returncode, 1)
        self.assertIn("no adapter 'math'", gone.stderr)

    def test_malformed_submissions_name_the_field_and_the_service_keeps_working(self):
        good = {"text": "1+1=", "reference": "2"}
        cases = [
            ([], [], "prompts: expected at least one prompt"),
            ([good], ["--reward", "nope"], "reward"),
            ([{"tokens": [1, 99]}], [], "prompts[0].tokens[1]"),
            ([good], ["--samples", 0], "samples_per_prompt"),
            ([good], ["--samples", 1000000], "samples_per_prompt"),
            ([good], ["--weight", 10000], "--weight: expected 0.001 to 1000"),
            ([good], ["--eval-every", -2], "eval.every_versions: expected 0 (a training set) or"),
            ([{"text": "1+1=" * 10}], [], "exceeds the model's context"),
            ([{"text": "abc"}], [], "prompts[0].text"),
        ]
        for lines, flags, message in cases:
            proc = self.submit(self.prompts("bad.jsonl", lines), *flags)
            self.assertEqual(proc.returncode, 1, proc.stdout)
            self.assertIn(message, proc.stderr)
        self.assertEqual(self.submit(self.prompts("good.jsonl", [good])).returncode, 0)
        too_many = self.prompts("many.jsonl", [good] * 60)
        proc = self.submit(too_many)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("limit is 50", proc.stderr)

    def test_accepted_sets_survive_a_killed_coordinator(self):
        path = self.prompts("durable.jsonl", [{"text": "9+9=", "reference": "18"}] * 3)
        first = json.loads(self.submit(path, "--idempotency-key", "abc").stdout)
        self.stop(signal.SIGKILL)
        self.start()
        status = json.loads(run("status", first["prompt_set_id"], "--server", self.server,
                                "--json", check=True).stdout)
        self.assertEqual(status[0]["prompts_total"], 3)
        again = json.loads(self.submit(path, "--idempotency-key", "abc").stdout)
        self.assertTrue(again["duplicate"])
        self.assertEqual(again["prompt_set_id"], first["prompt_set_id"])

    def test_an_unreachable_server_is_a_clear_error(self):
        proc = run("status", "--server", "127.0.0.1:1")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("prl: error", proc.stderr)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
