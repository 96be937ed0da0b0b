#!/usr/bin/python3
"""Black-box tests of `prl learner step|train`, `prl export` and `prl bench learner`:
resume after kill -9 is bit-identical, a killed rank makes the others fail with a time-out
error instead of hanging, input errors name the line and field, the bench JSON format.

usage: learner_cli_test.py PATH_TO_PRL [unittest args]
"""
import array
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

PRL = None


def run(*args, check=False, timeout=600):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s" % (" ".join(map(str, args)),
                                                         proc.returncode, proc.stderr))
    return proc


class LearnerCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_learner_cli_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 2, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 48, "--vocab-size", 40,
            "--max-position-embeddings", 64, "--seed", 3, "--out", cls.model, check=True)
        rng = random.Random(5)
        cls.rollouts = os.path.join(cls.dir, "rollouts.jsonl")
        with open(cls.rollouts, "w") as f:
            for g in range(6):
                for _ in range(4):
                    completion = [rng.randrange(40) for _ in range(rng.randint(1, 10))]
                    f.write(json.dumps({
                        "prompt": [rng.randrange(40) for _ in range(rng.randint(2, 6))],
                        "completion": completion,
                        "behaviour_logprobs": [-rng.uniform(2.5, 4.5) for _ in completion],
                        "reward": float(rng.randrange(2)), "group": "g%d" % g}) + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, lines):
        with open(self.path(name), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        return self.path(name)

    def assert_error(self, proc, *fragments):
        self.assertEqual(proc.returncode, 1, proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)

    def cuda_build(self):
        return "built without CUDA" not in run("--version", check=True).stdout

    def train_args(self, ckpt, steps, *extra):
        return ["learner", "train", "--model", self.model, "--rollouts", self.rollouts,
                "--checkpoint-dir", self.path(ckpt), "--steps", steps, "--samples-per-step", 7,
                "--lr", "1e-3", "--world-size", 2, *extra]

    def test_every_learner_command_has_help(self):
        for cmd in [["learner"], ["learner", "step"], ["learner", "train"], ["export"],
                    ["bench", "learner"]]:
            proc = run(*cmd, "--help")
            self.assertEqual(proc.returncode, 0, cmd)
            self.assertIn("Usage", proc.stdout, cmd)

    def test_resume_after_kill_is_bit_identical(self):
        uninterrupted = self.path("uninterrupted")
        run(*self.train_args("ckpt_full", 40, "--checkpoint-every", 2), "--out", uninterrupted,
            check=True)
        # Start again in a fresh directory; kill -9 the whole process group (launcher and
        # ranks) once the checkpoint of step 2 exists (of 40, one every 2 steps), then resume.
        latest = self.path("ckpt_killed/latest")
        killed_args = self.train_args("ckpt_killed", 40, "--checkpoint-every", 2)
        proc = subprocess.Popen([PRL, *map(str, killed_args)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 300
        reached = False
        while time.time() < deadline and not reached:
            if os.path.exists(latest):
                with open(latest) as f:
                    reached = f.read().strip() >= "step-00000002"
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        # The kill must land mid-run, after the second checkpoint and before the last step:
        # a run that ended first (or never checkpointed) tests nothing.
        self.assertIsNone(proc.poll(), "the run ended before the kill: nothing was tested")
        self.assertTrue(reached, "no second checkpoint within 300 s")
        os.killpg(proc.pid, signal.SIGKILL)
        self.assertEqual(proc.wait(), -signal.SIGKILL)
        with open(latest) as f:
            self.assertLess(f.read().strip(), "step-00000040", "killed after the last step")
        resumed = self.path("resumed")
        out = run(*killed_args, "--out", resumed, check=True).stdout
        self.assertIn("resumed from", out)
        with open(os.path.join(uninterrupted, "model.safetensors"), "rb") as a, \
                open(os.path.join(resumed, "model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read(), "the resumed run's weights differ")
        # The export of the last checkpoint is the same model.
        exported = self.path("exported")
        run("export", "--checkpoint-dir", self.path("ckpt_killed"), "--out", exported,
            check=True)
        with open(os.path.join(exported, "model.safetensors"), "rb") as a, \
                open(os.path.join(resumed, "model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_resume_with_another_world_size_is_an_error(self):
        run(*self.train_args("ckpt_w2", 1), check=True)
        args = self.train_args("ckpt_w2", 2)
        args[args.index("--world-size") + 1] = 3
        self.assert_error(run(*args), "world_size", "'2'", "'3'")

    def test_a_killed_rank_makes_the_others_fail_with_a_timeout_not_hang(self):
        proc = subprocess.Popen([PRL, *map(str, self.train_args(
            "ckpt_dead_rank", 100000, "--timeout-s", 3, "--checkpoint-every", 1000))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            proc.stdout.readline()  # the first step finished: the ranks are mid-run
            ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                   text=True).stdout.split()
            self.assertEqual(len(ranks), 2, "expected two rank processes")
            os.kill(int(ranks[1]), signal.SIGKILL)
            killed_at = time.time()
            _, err = proc.communicate(timeout=60)
            elapsed = time.time() - killed_at
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        self.assertNotEqual(proc.returncode, 0)
        self.assertLess(elapsed, 30, "the surviving rank did not give up in time")
        self.assertIn("was killed by signal 9", err)
        self.assertRegex(err, r"collective \w+ on rank 0 of 2")

    def test_a_hung_rank_makes_the_others_fail_with_a_timeout_not_hang(self):
        proc = subprocess.Popen([PRL, *map(str, self.train_args(
            "ckpt_hung_rank", 100000, "--timeout-s", 3, "--checkpoint-every", 1000))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            proc.stdout.readline()
            ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                   text=True).stdout.split()
            self.assertEqual(len(ranks), 2, "expected two rank processes")
            os.kill(int(ranks[1]), signal.SIGSTOP)  # alive, connected, silent
            stopped_at = time.time()
            _, err = proc.communicate(timeout=60)
            elapsed = time.time() - stopped_at
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        self.assertNotEqual(proc.returncode, 0)
        # Rank 0 gives up after its 3 s time-out; the launcher kills the stopped rank 5 s later.
        self.assertLess(elapsed, 30)
        self.assertRegex(err, r"collective \w+ on rank 0 of 2: no answer from a peer within 3 s")
        self.assertIn("rank 1 was killed by signal 9", err)

    def test_step_errors_name_the_line_and_field(self):
        good = {"prompt": [1, 2], "completion": [3, 4], "behaviour_logprobs": [-1.0, -2.0],
                "advantage": 0.5}
        cases = [
            (dict(good, completion=[3, 99]), "line 2: completion[1] = 99 is not a token id"),
            (dict(good, behaviour_logprobs=[-1.0]), "line 2: \"behaviour_logprobs\" has 1"),
            (dict(good, behaviour_logprobs=[-1.0, 0.5]), "behaviour_logprobs[1] = 0.5"),
            ({k: v for k, v in good.items() if k != "advantage"}, "line 2: missing"),
            (dict(good, reward=1.0, group="a"), "not both"),
            (dict(good, extra=1), "unknown key 'extra'"),
        ]
        for bad, message in cases:
            path = self.write("bad.jsonl", [good, bad])
            self.assert_error(run("learner", "step", "--model", self.model, "--rollouts", path,
                                  "--out", self.path("never")), "bad.jsonl", message)
        ok = self.write("ok.jsonl", [good])
        self.assert_error(run("learner", "step", "--model", self.model, "--rollouts", ok,
                              "--out", self.path("never"), "--loss", "nope"),
                          "reinforce_tis")
        self.assert_error(run("learner", "step", "--model", self.model, "--rollouts", ok,
                              "--out", self.path("never"), "--world-size", 0),
                          "learner.world_size: expected 1 to 64, found 0")
        self.assert_error(run("learner", "step", "--model", self.model, "--rollouts", ok,
                              "--out", self.path("never"), "--lr", -1),
                          "learner.lr: expected a number > 0, found -1")
        self.assertFalse(os.path.exists(self.path("never")))

    def test_device_and_dtype_errors_say_what_runs_where(self):
        ok = self.write("ok_dev.jsonl", [{"prompt": [1, 2], "completion": [3],
                                          "behaviour_logprobs": [-1.0], "advantage": 0.5}])
        base = ["learner", "step", "--model", self.model, "--rollouts", ok, "--out",
                self.path("never")]
        self.assert_error(run(*base, "--dtype", "bf16"),
                          "learner.dtype: expected fp32 on the CPU (bf16 runs on CUDA only")
        self.assert_error(run(*base, "--dtype", "f16"),
                          "learner.dtype: expected one of fp32, f32, bf16; found 'f16'")
        self.assert_error(run(*base, "--device", "tpu"), "tpu")
        self.assert_error(run("bench", "learner", "--config", "tiny", "--dtype", "bf16"),
                          "--dtype bf16 runs on CUDA only")
        if not os.path.exists("/dev/nvidia0"):  # this machine has no GPU: cuda is refused
            self.assert_error(run(*base, "--device", "cuda"), "learner.device = cuda",
                              "usable CUDA GPU" if self.cuda_build() else "-DPRL_CUDA=ON")
        self.assertFalse(os.path.exists(self.path("never")))

    def test_step_report_has_the_documented_fields(self):
        proc = run("learner", "step", "--model", self.model, "--rollouts", self.rollouts,
                   "--out", self.path("stepped"), "--world-size", 2, "--json", check=True)
        report = json.loads(proc.stdout)
        for key in ["loss", "mean_ratio", "max_ratio", "clipped_fraction",
                    "effective_sample_size", "kl_behaviour_learner", "entropy", "lag_mean",
                    "lag_max", "trained_tokens", "grad_norm", "rank0_memory_bytes",
                    "policy_entropy", "peak_activation_bytes"]:
            self.assertIn(key, report)
        # The policy's entropy over a 40-token vocabulary: above 0, at most log 40.
        self.assertGreater(report["policy_entropy"], 0.0)
        self.assertLessEqual(report["policy_entropy"], math.log(40) + 1e-6)
        self.assertGreater(report["peak_activation_bytes"], 0)
        self.assertEqual(report["sequences"], 24)
        self.assertEqual(report["dropped_groups"], 0)
        self.assertTrue(os.path.exists(self.path("stepped/model.safetensors")))
        # --drop-uniform-groups: the report counts the groups it dropped, as the file has them.
        rewards = {}
        with open(self.rollouts) as f:
            for line in f:
                r = json.loads(line)
                rewards.setdefault(r["group"], set()).add(r["reward"])
        uniform = sum(1 for values in rewards.values() if len(values) == 1)
        self.assertGreater(len(rewards), uniform, "the file must keep a group to train on")
        proc = run("learner", "step", "--model", self.model, "--rollouts", self.rollouts,
                   "--out", self.path("stepped_dropped"), "--world-size", 2, "--json",
                   "--drop-uniform-groups", check=True)
        dropped = json.loads(proc.stdout)
        self.assertEqual(dropped["dropped_groups"], uniform)
        self.assertEqual(dropped["sequences"], 24 - 4 * uniform)

    def test_kl_to_the_reference_starts_at_zero_and_grows_as_the_policy_moves(self):
        # learner.kl_coef: every rank holds the starting model as its frozen reference.
        proc = run("learner", "step", "--model", self.model, "--rollouts", self.rollouts,
                   "--out", self.path("kl_stepped"), "--world-size", 2, "--kl-coef", 0.1,
                   "--json", check=True)
        self.assertEqual(json.loads(proc.stdout)["reference_kl"], 0.0)
        proc = run(*self.train_args("kl_ckpt", 4, "--kl-coef", 0.1, "--kl-estimator", "k2"),
                   check=True)
        kls = [float(line.split("ref KL ")[1].split(",")[0])
               for line in proc.stdout.splitlines() if "ref KL " in line]
        self.assertEqual(len(kls), 4, proc.stdout)
        self.assertEqual(kls[0], 0.0)
        self.assertGreater(kls[-1], 0.0)
        # A reference of another vocabulary, and a reference without a penalty, are refused.
        other = self.path("other_vocab")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 1, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 48, "--vocab-size", 41,
            "--max-position-embeddings", 64, "--out", other, check=True)
        base = ["learner", "step", "--model", self.model, "--rollouts", self.rollouts, "--out",
                self.path("kl_never")]
        self.assert_error(run(*base, "--kl-coef", 0.1, "--kl-reference", other),
                          "learner.kl_reference: expected a model with the policy's vocabulary "
                          "(vocab_size 40), found vocab_size 41")
        self.assert_error(run(*base, "--kl-reference", other),
                          "learner.kl_reference: expected empty while learner.kl_coef is 0")
        self.assert_error(run(*base, "--kl-coef", 0.1, "--kl-estimator", "k4"), "k4", "k3")
        self.assertFalse(os.path.exists(self.path("kl_never")))

    def test_bench_learner_prints_the_documented_json(self):
        proc = run("bench", "learner", "--config", "tiny", "--tokens", 256, "--seq-len", 64,
                   "--iters", 1, "--world-sizes", "1,2", "--json", check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "learner")
        names = [r["name"] for r in report["results"]]
        self.assertEqual(names, ["w1_tokens_per_s", "w1_gflops", "w1_peak_activation_mb_per_rank",
                                 "w1_state_mb_per_rank", "w1_unit_buffers_mb_per_rank",
                                 "w2_tokens_per_s", "w2_gflops", "w2_peak_activation_mb_per_rank",
                                 "w2_state_mb_per_rank", "w2_unit_buffers_mb_per_rank"])
        by_name = {r["name"]: r for r in report["results"]}
        # Sharded state halves (up to padding) at world size 2.
        self.assertAlmostEqual(by_name["w2_state_mb_per_rank"]["value"],
                               by_name["w1_state_mb_per_rank"]["value"] / 2, delta=0.01)
        self.assertEqual(by_name["w1_unit_buffers_mb_per_rank"]["value"], 0)

    def test_bench_learner_of_adapters_measures_each_world_size_beside_one_rank(self):
        proc = run("bench", "learner", "--config", "tiny", "--adapters", 4, "--tokens", 128,
                   "--seq-len", 64, "--iters", 1, "--world-sizes", "1,2", "--json", check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "learner --adapters")
        by_name = {r["name"]: r for r in report["results"]}
        self.assertEqual(sorted(by_name), ["w1_adapter_tokens_per_s",
                                           "w1_joint_adapter_tokens_per_s", "w1_ranks_memory_mb",
                                           "w2_adapter_tokens_per_s",
                                           "w2_joint_adapter_tokens_per_s", "w2_ranks_memory_mb"])
        two = by_name["w2_adapter_tokens_per_s"]
        self.assertEqual(two["baseline_name"], "w1_adapter_tokens_per_s")
        self.assertEqual(two["baseline_value"], by_name["w1_adapter_tokens_per_s"]["value"])
        self.assertGreater(two["value"], 0)
        # The joint steps beside the same world size's steps one after another, in the same run.
        for w in (1, 2):
            joint = by_name["w%d_joint_adapter_tokens_per_s" % w]
            self.assertEqual(joint["baseline_name"], "w%d_adapter_tokens_per_s" % w)
            self.assertEqual(joint["baseline_value"], by_name["w%d_adapter_tokens_per_s" % w]["value"])
            self.assertGreater(joint["value"], 0)
        self.assertGreater(by_name["w2_ranks_memory_mb"]["value"], 0)
        # More ranks than adapters: refused naming the flag.
        self.assert_error(run("bench", "learner", "--config", "tiny", "--adapters", 1,
                              "--world-sizes", "1,2"), "world size 2: expected 1 to --adapters")

    def test_bench_learner_measures_each_length_and_checkpointing_mode_beside_the_first(self):
        proc = run("bench", "learner", "--config", "tiny", "--tokens", 64, "--seq-len", "96,192",
                   "--checkpointing", "none,full", "--iters", 1, "--world-sizes", 1, "--json",
                   check=True)
        by_name = {r["name"]: r for r in json.loads(proc.stdout)["results"]}
        for length in (96, 192):
            none = by_name["s%d_none_w1_peak_activation_mb_per_rank" % length]
            full = by_name["s%d_full_w1_peak_activation_mb_per_rank" % length]
            self.assertEqual(full["baseline_name"], "none_peak_activation_mb")
            self.assertEqual(full["baseline_value"], none["value"])
            self.assertLess(full["value"], none["value"])
            speed = by_name["s%d_full_w1_tokens_per_s" % length]
            self.assertEqual(speed["baseline_value"],
                             by_name["s%d_none_w1_tokens_per_s" % length]["value"])
        self.assertLess(by_name["s96_none_w1_peak_activation_mb_per_rank"]["value"],
                        by_name["s192_none_w1_peak_activation_mb_per_rank"]["value"])
        self.assert_error(run("bench", "learner", "--config", "tiny", "--checkpointing", "most"),
                          "--checkpointing", "selective")

    def test_bench_learner_measures_context_parallel_groups_beside_one_rank(self):
        proc = run("bench", "learner", "--config", "tiny", "--tokens", 64, "--seq-len", 512,
                   "--context-parallel", "1,2", "--iters", 1, "--world-sizes", 1, "--json",
                   check=True)
        by_name = {r["name"]: r for r in json.loads(proc.stdout)["results"]}
        one = by_name["c1_w1_peak_activation_mb_per_rank"]
        group = by_name["c2_w2_peak_activation_mb_per_rank"]  # world = 1 data-parallel x 2
        self.assertEqual(group["baseline_name"], "one_rank_peak_activation_mb")
        self.assertEqual(group["baseline_value"], one["value"])
        self.assertLess(group["value"], one["value"])
        self.assertEqual(by_name["c2_w2_tokens_per_s"]["baseline_value"],
                         by_name["c1_w1_tokens_per_s"]["value"])

    def test_checkpointed_steps_give_the_gradients_of_keeping_every_activation(self):
        # learner.activation_checkpointing under FSDP at world sizes 1 to 3: the step's gradient
        # (--dump-grads) is none's bit for bit, and the pass lays out less.
        for world in (1, 2, 3):
            dumps, peaks = {}, {}
            for mode in ("none", "selective", "full"):
                dump = self.path("grads_%s_w%d.safetensors" % (mode, world))
                proc = run("learner", "step", "--model", self.model, "--rollouts",
                           self.rollouts, "--out", self.path("ckpt_%s_w%d" % (mode, world)),
                           "--world-size", world, "--activation-checkpointing", mode,
                           "--dump-grads", dump, "--json", check=True)
                peaks[mode] = json.loads(proc.stdout)["peak_activation_bytes"]
                with open(dump, "rb") as f:
                    dumps[mode] = f.read()
            self.assertEqual(dumps["selective"], dumps["none"], "world size %d" % world)
            self.assertEqual(dumps["full"], dumps["none"], "world size %d" % world)
            self.assertLess(peaks["full"], peaks["selective"])
            self.assertLess(peaks["selective"], peaks["none"])

    def test_context_parallel_steps_give_the_one_rank_gradient(self):
        # learner.context_parallel: groups of 2 and 3 ranks (with 2 groups at world size 4) split
        # every sequence; the step's gradient (--dump-grads, F32 safetensors) is the one-rank
        # step's within 1e-5 relative, and so is its loss.
        def gradient(path):
            with open(path, "rb") as f:
                data = f.read()
            n = struct.unpack("<Q", data[:8])[0]
            header = json.loads(data[8:8 + n])
            values = []
            for name in sorted(k for k in header if k != "__metadata__"):
                begin, end = header[name]["data_offsets"]
                values.extend(array.array("f", data[8 + n + begin:8 + n + end]))
            return values

        def step(world, context, *extra):
            dump = self.path("cp_grads_w%d_c%d%s.safetensors" % (world, context, "".join(extra)))
            proc = run("learner", "step", "--model", self.model, "--rollouts", self.rollouts,
                       "--out", self.path("cp_w%d_c%d%s" % (world, context, "".join(extra))),
                       "--world-size", world, "--context-parallel", context,
                       "--dump-grads", dump, "--json", *extra, check=True)
            return json.loads(proc.stdout), gradient(dump)

        one, g1 = step(1, 1)
        for world, context in ((2, 2), (3, 3), (4, 2)):
            report, g = step(world, context)
            diff = sum((a - b) ** 2 for a, b in zip(g, g1)) ** 0.5
            norm = sum(b * b for b in g1) ** 0.5
            self.assertLess(diff / norm, 1e-5, "world %d, groups of %d" % (world, context))
            self.assertAlmostEqual(report["loss"], one["loss"], places=5)
            self.assertEqual(report["trained_tokens"], one["trained_tokens"])
            self.assertEqual(report["sequences"], one["sequences"])
        # With full checkpointing too (the recomputation gathers the group's keys again).
        _, g = step(2, 2, "--activation-checkpointing", "full")
        diff = sum((a - b) ** 2 for a, b in zip(g, g1)) ** 0.5
        self.assertLess(diff / norm, 1e-5)
        # Ulysses' all-to-all over heads and ring attention give the same step (the tiny
        # model's 4 heads over groups of 2; the ring over 3 too).
        for world, context, attention in ((2, 2, "ulysses"), (4, 2, "ulysses"), (2, 2, "ring"),
                                          (3, 3, "ring")):
            report, g = step(world, context, "--context-attention", attention)
            diff = sum((a - b) ** 2 for a, b in zip(g, g1)) ** 0.5
            self.assertLess(diff / norm, 1e-5, "%s, world %d, groups of %d" % (attention, world,
                                                                              context))
            self.assertAlmostEqual(report["loss"], one["loss"], places=5)
        # A group that does not split the heads is refused before any rank connects.
        self.assert_error(run("learner", "step", "--model", self.model, "--rollouts",
                              self.rollouts, "--out", self.path("cp_never"), "--world-size", 3,
                              "--context-parallel", 3, "--context-attention", "ulysses"),
                          "learner.context_parallel = 3", "allgather")
        # Settings that cannot be split are refused, naming them.
        self.assert_error(run("learner", "step", "--model", self.model, "--rollouts",
                              self.rollouts, "--out", self.path("cp_never"), "--world-size", 3,
                              "--context-parallel", 2), "learner.context_parallel",
                          "a divisor of learner.world_size = 3")
        # The sequence-mean normalization divides each share by its whole sequence's tokens;
        # gspo's ratio is each whole sequence's, its sums reduced over the group; kl_penalty
        # reward's return to go adds the later chunks' penalties other ranks hold.
        for extra in (("--normalization", "sequence"), ("--loss", "gspo"),
                      ("--kl-coef", "0.1", "--kl-penalty", "reward")):
            one_seq, g1_seq = step(1, 1, *extra)
            report, g = step(2, 2, *extra)
            diff = sum((a - b) ** 2 for a, b in zip(g, g1_seq)) ** 0.5
            self.assertLess(diff / sum(b * b for b in g1_seq) ** 0.5, 1e-5, extra)
            self.assertAlmostEqual(report["loss"], one_seq["loss"], places=5)

    def test_an_activation_budget_splits_micro_batches_and_refuses_what_cannot_fit(self):
        # 8 rollouts of 60 tokens: one micro-batch of ~2.5 MB of workspace without a budget.
        rng = random.Random(8)
        lines = []
        for g in range(2):
            for _ in range(4):
                completion = [rng.randrange(40) for _ in range(50)]
                lines.append({"prompt": [rng.randrange(40) for _ in range(10)],
                              "completion": completion,
                              "behaviour_logprobs": [-rng.uniform(2.5, 4.5) for _ in completion],
                              "reward": float(rng.randrange(2)), "group": "g%d" % g})
        rollouts = self.write("budget_rollouts.jsonl", lines)
        base = ["learner", "step", "--model", self.model, "--rollouts", rollouts, "--json"]
        whole = json.loads(run(*base, "--out", self.path("budget_none"), check=True).stdout)
        self.assertEqual(whole["micro_batches_per_rank"], 1)
        self.assertGreater(whole["peak_activation_bytes"], 1 << 20)
        # A budget of 1 MiB: the micro-batch is split into passes that fit; the step is the same.
        split = json.loads(run(*base, "--out", self.path("budget_split"),
                               "--activation-budget-mb", 1, check=True).stdout)
        self.assertGreater(split["micro_batches_per_rank"], 1)
        self.assertLessEqual(split["peak_activation_bytes"], 1 << 20)
        self.assertAlmostEqual(split["loss"], whole["loss"], places=5)
        self.assertAlmostEqual(split["grad_norm"], whole["grad_norm"], places=5)
        # A wider model whose one sequence needs more than 1 MiB: refused before any pass, naming
        # the settings and what full checkpointing would fit.
        wide = self.path("wide_model")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 256, "--layers", 2, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 1024, "--vocab-size", 40,
            "--max-position-embeddings", 64, "--seed", 3, "--out", wide, check=True)
        proc = run("learner", "step", "--model", wide, "--rollouts", rollouts, "--json",
                   "--out", self.path("budget_never"), "--activation-budget-mb", 1)
        self.assert_error(proc, "a sequence of 60 tokens needs learner.activation_budget_mb >= ",
                          "learner.activation_checkpointing = none", "full fits ")
        self.assertFalse(os.path.exists(self.path("budget_never")))

    def test_a_joint_step_is_refused_where_it_cannot_run_naming_the_flag(self):
        # (tests/reference/learner_joint_lora_matches_reference.sh checks the joint step itself.)
        adapter = self.path("joint_adapter")
        run("adapter", "init", "--model", self.model, "--rank", 2, "--targets", "q_proj",
            "--out", adapter, check=True)
        base = ["learner", "step", "--model", self.model, "--rollouts", self.rollouts]
        other = "%s,%s,%s" % (adapter, self.rollouts, self.path("joint_other"))
        self.assert_error(run(*base, "--out", self.path("joint_malformed"), "--lora-init", adapter,
                              "--joint", "%s,%s" % (adapter, self.rollouts)),
                          "--joint: expected ADAPTER,ROLLOUTS,OUT[,GRADS]")
        self.assert_error(run(*base, "--out", self.path("joint_two_ranks"), "--lora-init", adapter,
                              "--joint", other, "--world-size", 2),
                          "--joint: a joint step of adapters runs on one rank",
                          "learner.world_size 2")
        self.assert_error(run(*base, "--out", self.path("joint_no_lora"), "--joint", other),
                          "--joint: trains several LoRA adapters")
        for out in ("joint_malformed", "joint_two_ranks", "joint_no_lora", "joint_other"):
            self.assertFalse(os.path.exists(self.path(out)), out)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
