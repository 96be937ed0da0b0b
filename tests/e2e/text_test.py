#!/usr/bin/python3
"""Text through the service with a real model's own tokenizer (Qwen3's tokenizer.json and chat
template, a model with random weights made by `prl model init --tokenizer`): a client submits
text and chat prompts to roles started from one config and reads back decoded samples that text
rewards scored; a Qwen3-MoE directory with that tokenizer trains through `prl run`; and the
arithmetic task, exported as a prompt file, learns through that tokenizer (a supervised
warm-start, then RL, held-out accuracy before and after: a learning run, ctest `e2e.text_learning`,
label `learning`, run on demand as docs/development.md says).

usage: text_test.py PATH_TO_PRL QWEN3_TOKENIZER_DIR [unittest args]
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest

PRL = None
TOKENIZER = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, check=True, timeout=600):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s%s" % (" ".join(map(str, args)),
                                                           proc.returncode, proc.stdout,
                                                           proc.stderr))
    return proc


class TextTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json")):
            raise unittest.SkipTest("no Qwen3 tokenizer at %s: run scripts/setup_test_references.sh"
                                    % TOKENIZER)
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_text_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        run("model", "init", "--preset", "tiny", "--tokenizer", TOKENIZER,
            "--max-position-embeddings", 128, "--tie-embeddings", "--seed", 1, "--out", cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.tag = "text-%d-%s" % (os.getpid(), self.id().split(".")[-1][:16])
        self.work = os.path.join(self.dir, self.tag)
        os.makedirs(self.work)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        run("replay", "reset", "prl-%s-replay" % self.tag, "--force", check=False)
        if os.path.exists("/dev/shm/prl-%s-weights" % self.tag):
            os.remove("/dev/shm/prl-%s-weights" % self.tag)

    def path(self, name):
        return os.path.join(self.work, name)

    def write(self, name, lines):
        with open(self.path(name), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        return self.path(name)

    def start(self, name, *args):
        log = open(self.path(name + ".log"), "w")
        self.procs.append(subprocess.Popen([PRL, *map(str, args)], stdout=log,
                                           stderr=subprocess.STDOUT))
        log.close()

    def log(self, name):
        with open(self.path(name + ".log")) as f:
            return f.read()

    def wait_for(self, name, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log(name)):
                return
            time.sleep(0.1)
        self.fail("%s never printed %r:\n%s" % (name, pattern, self.log(name)))

    def test_text_and_chat_prompts_come_back_decoded_and_scored(self):
        port = free_port()
        config = self.path("config.json")
        with open(config, "w") as f:
            json.dump({"run": {"name": self.tag, "dir": self.work},
                       "model": {"path": self.model},
                       "task": {"name": "prompts"},
                       "coordinator": {"listen": "127.0.0.1:%d" % port},
                       "learner": {"steps": 0, "groups_per_step": 2},
                       "actors": {"kv_cache_mb": 64}}, f)
        self.start("coordinator", "coordinator", "--config", config)
        self.wait_for("coordinator", r"coordinator on port %d" % port)
        self.assertIn("text: tokenizer.json of %s (151669 tokens, chat template)" % self.model,
                      self.log("coordinator"))
        self.start("learner", "learner", "serve", "--config", config)
        self.start("actor", "actor", "--config", config, "--name", "a0")
        prompts = self.write("prompts.jsonl", [
            {"text": "The capital of France is", "reference": "Paris"},
            {"messages": [{"role": "system", "content": "Answer briefly."},
                          {"role": "user", "content": "What is 2+2?"}],
             "chat_template_kwargs": {"enable_thinking": False}, "reference": "4"},
            {"messages": [{"role": "user", "content": "Name a colour."}], "reference": "red"},
        ])
        # A text reward: 1 iff the decoded completion contains an "e".
        out = run("submit", prompts, "--server", "127.0.0.1:%d" % port, "--samples", 3,
                  "--max-tokens", 8, "--temperature", 1, "--reward", "regex", "--reward-param",
                  "pattern=e", "--show-texts", "--json", timeout=300).stdout
        groups = [json.loads(l) for l in out.splitlines() if '"texts"' in l]
        self.assertEqual(sorted(g["prompt_index"] for g in groups), [0, 1, 2], out)
        for g in groups:
            self.assertEqual(len(g["texts"]), 3)
            for text, reward, tokens in zip(g["texts"], g["rewards"], g["completion_tokens"]):
                self.assertIsInstance(text, str)
                self.assertGreater(tokens, 0)
                self.assertEqual(reward, 1.0 if "e" in text else 0.0,
                                 "the reward read another text than the one reported: %r" % text)
        texts = [t for g in groups for t in g["texts"]]
        self.assertTrue(any(texts), "every completion decoded to nothing: %r" % texts)
        self.assertIn("text: tokenizer.json", self.log("actor"))

    def test_the_arithmetic_task_learns_through_a_real_tokenizer(self):
        train, held_out = self.path("train.jsonl"), self.path("eval.jsonl")
        run("task", "export", "--max-digits", 2, "--count", 20000, "--out", train)
        run("task", "export", "--split", "eval", "--max-digits", 2, "--count", 300,
            "--out", held_out)
        proc = run("run", "--run-dir", self.path("run"), "--set", "run.name=" + self.tag,
                   "--set", "model.path=" + self.model, "--set", "task.name=prompts",
                   "--set", "task.train_file=" + train, "--set", "task.eval_file=" + held_out,
                   "--set", "task.reward=arithmetic", "--set", "task.credit=digits",
                   "--set", "task.eval_prompts=300", "--set", "sft.steps=400",
                   "--set", "sft.examples_per_step=64", "--set", "learner.steps=100",
                   "--set", "coordinator.listen=127.0.0.1:0", timeout=1500)
        summary_path = proc.stdout.strip().splitlines()[-1][len("summary: "):]
        with open(summary_path) as f:
            summary = json.load(f)
        print("\nqwen3-vocabulary arithmetic, held-out exact accuracy: %.3f (random model) -> "
              "%.3f (after %.0f s of warm-start) -> %.3f (after %d RL steps, %.0f s)" % (
                  summary["eval_init"], summary["eval_before"], summary["warm_start_seconds"],
                  summary["eval_after"], summary["steps"], summary["rl_seconds"]))
        self.assertEqual(summary["steps"], 100)
        # The path learns: from a random model's nothing to well above it.
        self.assertLess(summary["eval_init"], 0.05, summary)
        self.assertGreater(summary["eval_after"], summary["eval_init"] + 0.15, summary)

    def test_a_qwen3_moe_model_directory_with_its_tokenizer_runs(self):
        # model.path: a Qwen3-MoE directory (config.json, safetensors, Qwen3's tokenizer files)
        # trains through the whole service, its routes recorded and checked by the learner.
        model = self.path("qwen3-moe")
        run("model", "init", "--preset", "tiny-qwen3-moe", "--tokenizer", TOKENIZER,
            "--max-position-embeddings", 128, "--seed", 2, "--out", model)
        info = run("model", "info", model).stdout
        self.assertIn("Qwen3MoeForCausalLM", info)
        train = self.path("train.jsonl")
        run("task", "export", "--max-digits", 1, "--count", 2000, "--out", train)
        proc = run("run", "--run-dir", self.path("run"), "--set", "run.name=" + self.tag,
                   "--set", "model.path=" + model, "--set", "task.name=prompts",
                   "--set", "task.train_file=" + train, "--set", "task.eval_file=" + train,
                   "--set", "task.reward=arithmetic", "--set", "task.eval_prompts=20",
                   "--set", "task.max_tokens=4", "--set", "sft.steps=20",
                   "--set", "sft.examples_per_step=16", "--set", "learner.steps=4",
                   "--set", "learner.groups_per_step=2",
                   "--set", "coordinator.listen=127.0.0.1:0", timeout=1500)
        self.assertIn("text: tokenizer.json of " + model, proc.stdout)
        with open(os.path.join(self.path("run"), "learner_steps.jsonl")) as f:
            steps = [json.loads(line) for line in f]
        self.assertEqual(len(steps), 4)
        self.assertGreater(sum(s["routed_tokens"] + s["lagged_routed_tokens"] for s in steps), 0)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    TOKENIZER = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
