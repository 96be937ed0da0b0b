#!/usr/bin/python3
"""A tool-using task trains through `prl run` both ways (docs/agents.md, docs/environments.md), on
the tiny model with Qwen3's real tokenizer and chat template (the npm reference package
scripts/setup_test_references.sh installs; random weights from `prl model init --tokenizer`):

- with an environment and parsed tool calls: the built-in calculator offered as an OpenAI
  function tool (env.params.tool_name), the model's calls in Qwen3's own format (hermes) parsed
  into structured calls the environment answers with tool messages;
- with an agent through the endpoint: examples/openai_agent (the official `openai` npm client,
  pinned; scripts/setup_agent_example.sh), started as a user would and named by agent.address,
  nothing else; every call it makes goes to the actor's OpenAI-compatible endpoint.

Both start from one short warm-start on the calculator's demonstrations (the tool through the
template), made once for the class by a run of one RL step (its model-sft directory is the
model both runs start from), so the model calls the tool and its episodes have two or more
turns (calls). What is
pinned: the runs finish every step; the episodes use the tool; the records are what was sampled
(at the first step, before any weight moved, the learner's log-probs equal the behaviour
log-probs the engine reported: KL ~ 0). Learning (held-out success 0.00 -> 0.75 and -> 1.00) is
measured, not asserted here: its warm-start takes 18 minutes on 2 cores (docs/agents.md,
"Learning").

usage: agent_run_test.py PATH_TO_PRL QWEN3_TOKENIZER_DIR [unittest args]
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
AGENT_DIR = os.path.join(ROOT, "examples", "openai_agent")
PRL = None
TOKENIZER = None

TASK = {"name": "prompts", "max_tokens": 40, "eval_prompts": 16, "samples_per_prompt": 4}
TOOL_ENV = {"name": "calculator", "params": {"tool_name": "calculator"}, "max_turns": 3}
LEARNER = {"steps": 4, "groups_per_step": 4, "lr": 3e-4}


def run(*args, timeout=600):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s%s" % (" ".join(map(str, args)),
                                                           proc.returncode, proc.stdout[-4000:],
                                                           proc.stderr[-4000:]))
    return proc


class AgentRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json")):
            raise unittest.SkipTest("no Qwen3 tokenizer at %s: run scripts/setup_test_references.sh"
                                    % TOKENIZER)
        cls.tmp = tempfile.mkdtemp(prefix="prl_agent_run_test_")
        cls.model = os.path.join(cls.tmp, "model")
        run("model", "init", "--preset", "tiny", "--tokenizer", TOKENIZER,
            "--max-position-embeddings", 512, "--tie-embeddings", "--seed", 1, "--out", cls.model)
        chat = ["--chat", "--chat-template-kwargs", '{"enable_thinking": false}', "--operations",
                "*", "--min-digits", 2, "--max-digits", 2]
        cls.train = os.path.join(cls.tmp, "train.jsonl")
        cls.held_out = os.path.join(cls.tmp, "eval.jsonl")
        run("task", "export", *chat, "--count", 1000, "--out", cls.train)
        run("task", "export", *chat, "--split", "eval", "--count", TASK["eval_prompts"],
            "--out", cls.held_out)
        # The warm-start both runs share: its demonstrations and the model it trained.
        cls.warm_model = cls.model
        _, _, warm_dir, _ = cls.prl_run("warm", cls.config(
            sft={"steps": 120, "examples_per_step": 16, "env_demo_fraction": 1.0},
            task=dict(TASK, train_file=cls.train, eval_file=cls.held_out, eval_prompts=4),
            learner=dict(LEARNER, steps=1, groups_per_step=1)))
        cls.warm_model = os.path.join(warm_dir, "model-sft")
        cls.demonstrations = os.path.join(warm_dir, "sft.jsonl")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def prl_run(cls, name, config):
        run_dir = os.path.join(cls.tmp, name)
        tag = "t%d-%s" % (os.getpid(), name)
        config = dict(config, run={"name": tag, "dir": run_dir},
                      coordinator={"listen": "127.0.0.1:0"}, broadcast={"listen": "127.0.0.1:0"})
        path = os.path.join(cls.tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(config, f)
        try:
            out = run("run", "--config", path, timeout=1200).stdout
        finally:
            for shm in glob.glob("/dev/shm/prl-%s-*" % tag):
                os.remove(shm)
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "learner_steps.jsonl")) as f:
            steps = [json.loads(line) for line in f]
        return summary, steps, run_dir, out

    @classmethod
    def config(cls, **extra):
        # From the shared warm-start's model (setUpClass), with no warm-start of its own.
        return dict({"model": {"path": cls.warm_model},
                     "task": dict(TASK, train_file=cls.train, eval_file=cls.held_out),
                     "env": TOOL_ENV, "sft": {"steps": 0}, "learner": LEARNER}, **extra)

    def check_trained(self, summary, steps):
        self.assertEqual(summary["steps"], LEARNER["steps"])
        self.assertEqual([s["samples"] for s in steps],
                         [LEARNER["groups_per_step"] * TASK["samples_per_prompt"]] * len(steps))
        # Before any weight moved, the learner reads the records' tokens as the engine sampled
        # them: its log-probs are the behaviour log-probs (nothing re-tokenised or re-rendered).
        self.assertLess(abs(steps[0]["kl_behaviour_learner"]), 1e-6, steps[0])
        self.assertAlmostEqual(steps[0]["mean_ratio"], 1.0, delta=1e-4)

    def test_an_environment_answers_the_models_parsed_tool_calls(self):
        summary, steps, run_dir, out = self.prl_run("env", self.config())
        print("\nenvironment: held-out %.3f -> %.3f, two or more turns %.2f -> %.2f" % (
            summary["eval_before"], summary["eval_after"], summary["eval_multi_turn_before"],
            summary["eval_multi_turn_after"]))
        self.assertEqual(summary["environment"], "calculator")
        self.check_trained(summary, steps)
        self.assertGreater(summary["eval_multi_turn_before"], 0.5, "the warm model calls the tool")
        # The demonstrations: Qwen3's own call (<tool_call> ...), the tool's result the
        # environment's tokens.
        with open(self.demonstrations) as f:
            demo = json.loads(f.readline())
        self.assertEqual(demo["completion"][0], 151657, "a call opens with <tool_call>")
        self.assertIn(1, demo["sources"])

    def test_an_agent_written_with_the_openai_client_trains_through_the_endpoint(self):
        if shutil.which("node") is None or not os.path.isdir(
                os.path.join(AGENT_DIR, "node_modules", "openai")):
            self.skipTest("no node or examples/openai_agent/node_modules: run "
                          "scripts/setup_agent_example.sh")
        agent = subprocess.Popen(["node", os.path.join(AGENT_DIR, "calculator_agent.mjs"),
                                  "--listen", "127.0.0.1:0", "--verbose"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = agent.stdout.readline()  # "listening on HOST:PORT" once bound
            self.assertTrue(line.startswith("listening on "), line)
            address = line.split()[-1]
            # env: the warm-start's demonstrations only (the episodes are the agent's).
            summary, steps, run_dir, out = self.prl_run("agent", self.config(
                agent={"name": "calculator", "address": address, "max_calls": 3}))
        finally:
            agent.terminate()
            _, agent_log = agent.communicate(timeout=60)
        print("\nagent: held-out %.3f -> %.3f, two or more calls %.2f -> %.2f" % (
            summary["eval_before"], summary["eval_after"], summary["eval_multi_turn_before"],
            summary["eval_multi_turn_after"]))
        with open(os.path.join(run_dir, "logs", "actor-0.log")) as f:
            self.assertIn("OpenAI-compatible endpoint for agents at http://127.0.0.1:", f.read())
        self.assertIn("the agent at %s:" % address, out)
        self.assertEqual(summary["agent"], address)
        self.check_trained(summary, steps)
        self.assertGreater(summary["eval_multi_turn_before"], 0.5, "the agent's tool is used")
        # The trained episodes were the agent's, answered through the endpoint.
        episodes = [l for l in agent_log.splitlines() if l.startswith("episode ")]
        answered = [l for l in episodes if l.endswith(", answered")]
        self.assertGreaterEqual(len(answered), LEARNER["steps"] * LEARNER["groups_per_step"] *
                                TASK["samples_per_prompt"], agent_log[-2000:])
        # None failed but those in flight when the actor stopped after the last step: no group's
        # attempt failed (the actor logs each one it releases as failed), and the agent's failed
        # episodes are ones prl ended as the actor stopped, whichever reached the agent first
        # (docs/agents.md): RunEpisode cancelled, a call in flight answered 401 "the actor is
        # stopping", or a request sent as the endpoint closed its connections.
        with open(os.path.join(run_dir, "logs", "actor-0.log")) as f:
            self.assertNotIn("failed, released", f.read())
        at_stop = ("the episode was cancelled", "has ended: aborted: the actor is stopping",
                   "endpoint: Connection error.")
        self.assertFalse([l for l in episodes
                          if ": failed: " in l and not any(s in l for s in at_stop)],
                         agent_log[-2000:])


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    TOKENIZER = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
