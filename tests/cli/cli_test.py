#!/usr/bin/python3
"""Black-box tests of the `prl` command line: --help everywhere, input errors that name the
line and field, deterministic model init, packing-invariant scoring, the bench JSON format.

usage: cli_test.py PATH_TO_PRL [unittest args]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

PRL = None
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, check=False):
    proc = subprocess.run([PRL, *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError("prl %s failed (%d):\n%s" % (" ".join(map(str, args)),
                                                         proc.returncode, proc.stderr))
    return proc


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_cli_test_")
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "model")
        run("model", "init", "--arch", "qwen2", "--hidden-size", 32, "--layers", 2, "--heads", 4,
            "--kv-heads", 2, "--intermediate-size", 48, "--vocab-size", 40,
            "--max-position-embeddings", 16, "--seed", 3, "--out", cls.model, check=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)
        return self.path(name)

    def assert_error(self, proc, *fragments):
        self.assertEqual(proc.returncode, 1, proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)

    def test_every_command_has_help(self):
        for cmd in [[], ["model"], ["model", "init"], ["model", "info"], ["score"],
                    ["generate"], ["bench"], ["bench", "model"], ["bench", "engine"],
                    ["bench", "replay"], ["bench", "broadcast"], ["replay"], ["replay", "create"], ["replay", "stat"],
                    ["replay", "reset"], ["replay", "serve"]]:
            proc = run(*cmd, "--help")
            self.assertEqual(proc.returncode, 0, cmd)
            self.assertIn("Usage", proc.stdout, cmd)

    def test_submit_refuses_a_weight_outside_its_documented_range(self):
        # 0 travelled as "unset" and was leased as 1, though --help says 0.001 to 1000.
        for weight in ["0", "-1", "1000.5"]:
            with open(self.path("weight.jsonl"), "w") as f:
                f.write('{"text": "1+1="}\n')
            proc = run("submit", self.path("weight.jsonl"), "--weight", weight,
                       "--server", "127.0.0.1:1")
            self.assertEqual(proc.returncode, 1, weight)
            self.assertIn("--weight: expected 0.001 to 1000", proc.stderr, weight)

    def test_score_errors_name_the_line_and_field(self):
        cases = [
            ('{"tokens": [1, 2, 40], "score_from": 1}', "line 2: tokens[2] = 40 is not a token id"),
            ('{"tokens": [1, 2, -1], "score_from": 1}', "line 2: tokens[2] = -1"),
            ('{"tokens": [1, 2, 3], "score_from": 0}', "line 2: score_from = 0 is out of range"),
            ('{"tokens": [1, 2, 3], "score_from": 3}', "len(tokens) = 3"),
            ('{"tokens": [1], "score_from": 1}', "line 2: \"tokens\" has 1 entries"),
            ('{"tokens": %s, "score_from": 1}' % list(range(17)),
             "line 2: sequence of 17 tokens is longer than the model's max_position_embeddings"),
            ('{"tokens": [1, 2.5], "score_from": 1}', "line 2: tokens[1] = 2.5"),
            ('{"tokens": [1, 2], "score_from": 1', "line 2: malformed JSON"),
            ('{"tokens": [1, 2]}', "line 2: \"score_from\" must be an integer"),
            ('{"tokens": [1, 2], "score_from": 1, "extra": 0}', "line 2: unknown key 'extra'"),
            ('[1, 2]', "line 2: expected a JSON object"),
            ('', "line 2: empty line"),
        ]
        for bad, message in cases:
            with self.subTest(bad=bad):
                inp = self.write("bad.jsonl", '{"tokens": [1, 2], "score_from": 1}\n' + bad + "\n")
                out = self.path("bad_out.jsonl")
                proc = run("score", "--model", self.model, "--input", inp, "--output", out)
                self.assert_error(proc, message)
                self.assertFalse(os.path.exists(out), "no partial output on error")

    def test_score_reports_missing_files_and_bad_models(self):
        self.assert_error(run("score", "--model", self.path("absent"), "--input", "x",
                              "--output", "y"), "config.json")
        broken = self.path("broken")
        os.makedirs(broken, exist_ok=True)
        with open(os.path.join(self.model, "config.json")) as f:
            self.write("broken/config.json", f.read())
        with open(os.path.join(self.model, "model.safetensors"), "rb") as f:
            data = f.read()
        with open(os.path.join(broken, "model.safetensors"), "wb") as f:
            f.write(data[: len(data) // 2])
        inp = self.write("ok.jsonl", '{"tokens": [1, 2], "score_from": 1}\n')
        self.assert_error(run("score", "--model", broken, "--input", inp, "--output",
                              self.path("o.jsonl")), "model.safetensors", "truncated")

    def test_score_is_independent_of_packing(self):
        lines = [{"tokens": [(7 * i + j) % 40 for j in range(2 + i)], "score_from": 1 + i % 2}
                 for i in range(10)]
        inp = self.write("many.jsonl", "".join(json.dumps(l) + "\n" for l in lines))
        results = []
        for budget in (1, 12, 1000):
            out = self.path("packed_%d.jsonl" % budget)
            run("score", "--model", self.model, "--input", inp, "--output", out,
                "--max-batch-tokens", budget, check=True)
            with open(out) as f:
                results.append([json.loads(l)["logprobs"] for l in f])
        for other in results[1:]:
            for a, b in zip(results[0], other):
                self.assertEqual(len(a), len(b))
                for x, y in zip(a, b):
                    self.assertAlmostEqual(x, y, delta=1e-5)
        self.assertEqual([len(r) for r in results[0]],
                         [len(l["tokens"]) - l["score_from"] for l in lines])

    def test_model_init_is_deterministic_in_the_seed(self):
        def init(seed, name):
            out = self.path(name)
            run("model", "init", "--preset", "tiny", "--seed", seed, "--out", out, check=True)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                return f.read()
        self.assertEqual(init(1, "a"), init(1, "b"))
        self.assertNotEqual(init(1, "a"), init(2, "c"))

    def test_model_init_errors_name_the_flag(self):
        self.assert_error(run("model", "init", "--hidden-size", 32, "--out", self.path("x")),
                          "--layers is required")
        self.assert_error(run("model", "init", "--preset", "tiny", "--arch", "gpt2", "--out",
                              self.path("x")), "--arch", "gpt2")
        self.assert_error(run("model", "init", "--preset", "tiny", "--heads", 4, "--kv-heads", 3,
                              "--out", self.path("x")), "num_key_value_heads")
        self.assert_error(run("model", "init", "--preset", "nope", "--out", self.path("x")),
                          "unknown model preset 'nope'")

    def test_model_init_writes_sharded_bf16_that_loads(self):
        out = self.path("sharded")
        run("model", "init", "--preset", "tiny", "--dtype", "bf16", "--max-shard-mb", 0.05,
            "--out", out, check=True)
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors.index.json")))
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
        info = run("model", "info", out, check=True)
        self.assertIn("Qwen2ForCausalLM", info.stdout)

    def test_device_flag_is_validated(self):
        inp = self.write("d.jsonl", '{"tokens": [1, 2], "score_from": 1}\n')
        self.assert_error(run("score", "--model", self.model, "--input", inp, "--output",
                              self.path("d_out.jsonl"), "--device", "tpu"), "--device")

    def generate(self, name, *flags, prompts=None):
        prompts = prompts or [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
        inp = self.write(name + "_prompts.jsonl",
                         "".join(json.dumps({"tokens": p}) + "\n" for p in prompts))
        out = self.path(name + "_samples.jsonl")
        run("generate", "--model", self.model, "--input", inp, "--output", out, *flags,
            check=True)
        with open(out) as f:
            return prompts, [json.loads(line) for line in f]

    def test_generate_writes_one_line_per_sample_in_order(self):
        prompts, samples = self.generate("order", "--n", 3, "--max-tokens", 4, "--seed", 7)
        self.assertEqual([(s["prompt_index"], s["sample_index"]) for s in samples],
                         [(i, j) for i in range(3) for j in range(3)])
        for s in samples:
            self.assertEqual(set(s), {"prompt_index", "sample_index", "tokens", "logprobs",
                                      "versions", "finish_reason"})
            self.assertEqual(len(s["tokens"]), 4)
            self.assertEqual(len(s["logprobs"]), 4)
            self.assertEqual(s["versions"], [0, 0, 0, 0])
            self.assertEqual(s["finish_reason"], "length")
        _, again = self.generate("order2", "--n", 3, "--max-tokens", 4, "--seed", 7,
                                 "--max-num-seqs", 3, "--block-size", 1)
        self.assertEqual([s["tokens"] for s in again], [s["tokens"] for s in samples],
                         "same seeds, same samples, whatever the engine settings")

    def test_generate_logprobs_equal_score_at_temperature_one(self):
        for invariant in (False, True):
            flags = ["--batch-invariant"] if invariant else []
            prompts, samples = self.generate("gs%d" % invariant, "--n", 2, "--max-tokens", 6,
                                             *flags)
            lines = [{"tokens": prompts[s["prompt_index"]] + s["tokens"],
                      "score_from": len(prompts[s["prompt_index"]])} for s in samples]
            inp = self.write("gs_score%d.jsonl" % invariant,
                             "".join(json.dumps(l) + "\n" for l in lines))
            out = self.path("gs_scored%d.jsonl" % invariant)
            run("score", "--model", self.model, "--input", inp, "--output", out, *flags,
                check=True)
            with open(out) as f:
                scored = [json.loads(line)["logprobs"] for line in f]
            for s, ref in zip(samples, scored):
                if invariant:
                    self.assertEqual(s["logprobs"], ref, "bit for bit in batch-invariant mode")
                else:
                    for a, b in zip(s["logprobs"], ref):
                        self.assertAlmostEqual(a, b, delta=1e-5)

    def test_generate_errors_name_the_line_and_field(self):
        cases = [('{"tokens": []}', 'line 2: "tokens" must be a non-empty list'),
                 ('{"tokens": [1, 40]}', "line 2: tokens[1] = 40 is not a token id"),
                 ('{"tokens": [1], "temperature": 1}', "line 2: unknown key 'temperature'"),
                 ('{"tokens": [1], "seed": -1}', 'line 2: "seed" must be a non-negative'),
                 ('not json', "line 2: malformed JSON")]
        for bad, message in cases:
            with self.subTest(bad=bad):
                inp = self.write("gbad.jsonl", '{"tokens": [1, 2]}\n' + bad + "\n")
                self.assert_error(run("generate", "--model", self.model, "--input", inp,
                                      "--output", self.path("gbad_out.jsonl")), message)
        inp = self.write("glong.jsonl", '{"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n')
        self.assert_error(run("generate", "--model", self.model, "--input", inp, "--output",
                              self.path("o.jsonl"), "--max-tokens", 10),
                          "line 1: prompt (10 tokens) + max_tokens (10) exceeds the model's context")
        self.assert_error(run("generate", "--model", self.model, "--input", inp, "--output",
                              self.path("o.jsonl"), "--top-p", 0), "top_p must be in (0, 1]")

    def test_bench_engine_prints_the_documented_json(self):
        proc = run("bench", "engine", "--config", "tiny", "--prompt-len", 8, "--output-len", 4,
                   "--batches", "1,2", "--iters", 1, "--swap-interval-ms", 1, "--json",
                   check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "engine")
        names = [r["name"] for r in report["results"]]
        self.assertEqual(names, ["prefill_b1", "decode_b1", "prefill_b2", "decode_b2",
                                 "decode_b2_with_swaps"])

    def test_bench_model_prints_the_documented_json(self):
        proc = run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len", 32,
                   "--iters", 1, "--json", check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "model")
        self.assertIn("cpu", report["machine"])
        names = {r["name"] for r in report["results"]}
        self.assertEqual(names, {"forward_tokens_per_s", "forward_gflops", "train_tokens_per_s",
                                 "train_gflops"})
        for r in report["results"]:
            self.assertEqual(set(r), {"name", "value", "unit", "baseline_name", "baseline_value",
                                      "ratio"})
            self.assertGreater(r["value"], 0)
            self.assertAlmostEqual(r["ratio"], r["value"] / r["baseline_value"], places=6)

    def test_bench_model_keeps_or_recomputes_the_logits_and_refuses_a_bad_budget(self):
        for mb, said in ((0, "recomputed in the backward"), (64, "kept for the backward")):
            proc = run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len", 32,
                       "--iters", 1, "--keep-logits-mb", mb, check=True)
            self.assertIn(said, proc.stdout)
        proc = run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len", 32,
                   "--iters", 1, "--keep-logits-mb", -5)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--keep-logits-mb: expected -1", proc.stderr)
        self.assertIn("found -5", proc.stderr)

    def test_bench_model_mfu_and_torch_baseline_rows(self):
        # A stand-in interpreter that ignores the script and answers like it: one mode ran,
        # one failed (as torch.compile without a compiler would).
        fake = self.write("fake_python.sh", "#!/bin/sh\necho 'a library line on stdout'\necho '"
                          + json.dumps({"framework": "pytorch 9.9", "attention": "sdpa",
                                        "modes": {"eager": {"forward_tokens_per_s": 1000.0,
                                                            "train_tokens_per_s": 250.0,
                                                            "train_tflops": 0.5},
                                                  "compile": {"error": "no compiler"}}})
                          + "'\n")
        os.chmod(fake, 0o755)
        script = os.path.join(REPO, "bench", "torch_model_bench.py")
        proc = run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len", 32,
                   "--iters", 1, "--device", "cpu", "--peak-tflops", 2, "--torch-baseline", fake,
                   "--torch-script", script, "--json", check=True)
        report = json.loads(proc.stdout)
        rows = {(r["name"], r["baseline_name"]): r for r in report["results"]}
        mfu = rows[("train_tflops", "peak_from_flag")]
        self.assertEqual(mfu["baseline_value"], 2)
        self.assertAlmostEqual(mfu["ratio"], mfu["value"] / 2, places=6)
        torch_row = rows[("train_tokens_per_s", "pytorch_eager_f32")]
        self.assertEqual(torch_row["baseline_value"], 250.0)
        self.assertNotIn(("train_tokens_per_s", "pytorch_compile_f32"), rows)
        self.assertIn("no compiler", report["setup"]["torch_compile"])
        self.assertIn("--torch-baseline", " ".join(run("bench", "model", "--help").stdout.split()))
        # tokens that do not split into equal sequences, and a missing script, are errors
        self.assert_error(run("bench", "model", "--config", "tiny", "--tokens", 60, "--seq-len",
                              32, "--device", "cpu", "--torch-baseline", fake, "--torch-script",
                              script), "multiple of --seq-len")
        self.assert_error(run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len",
                              32, "--device", "cpu", "--torch-baseline", fake, "--torch-script",
                              self.path("missing.py")), "no script at")

    def test_bench_model_torch_baseline_runs_the_real_script(self):
        try:
            import torch  # noqa: F401  (python3-torch, scripts/setup.sh)
        except ImportError:
            self.skipTest("no torch for %s" % sys.executable)
        script = os.path.join(REPO, "bench", "torch_model_bench.py")
        proc = run("bench", "model", "--config", "tiny", "--tokens", 64, "--seq-len", 32,
                   "--iters", 1, "--device", "cpu", "--torch-baseline", sys.executable,
                   "--torch-script", script, "--torch-modes", "eager", "--json", check=True)
        report = json.loads(proc.stdout)
        rows = {(r["name"], r["baseline_name"]): r for r in report["results"]}
        self.assertGreater(rows[("train_tokens_per_s", "pytorch_eager_f32")]["baseline_value"], 0)
        self.assertIn("eager f32", report["setup"]["torch_eager"])

    def test_replay_segment_lifecycle_from_the_cli(self):
        name = "prl-cli-test-%d" % os.getpid()
        run("replay", "reset", name, "--force")
        try:
            run("replay", "create", name, "--capacity-mb", 4, "--label", "cli", check=True)
            self.assertTrue(os.path.exists("/dev/shm/" + name))
            self.assertEqual(os.stat("/dev/shm/" + name).st_mode & 0o777, 0o600, "owner-only")
            stat = json.loads(run("replay", "stat", name, "--json", check=True).stdout)
            self.assertEqual(stat["name"], name)
            self.assertEqual(stat["label"], "cli")
            self.assertEqual(stat["capacity_bytes"], 4 << 20)
            self.assertEqual(stat["groups_ready"], 0)
            self.assertFalse(stat["creator_alive"], "the creating CLI process has exited")
            self.assertIn("capacity_bytes", run("replay", "stat", name, check=True).stdout)
            # The creator is gone, so the segment counts as stale: a second create names the
            # ways out, and --reclaim-stale takes it.
            self.assert_error(run("replay", "create", name), "already exists", "dead",
                              "prl replay reset " + name, "--reclaim-stale")
            run("replay", "create", name, "--capacity-mb", 8, "--reclaim-stale", check=True)
            stat = json.loads(run("replay", "stat", name, "--json", check=True).stdout)
            self.assertEqual(stat["capacity_bytes"], 8 << 20)
            run("replay", "reset", name, check=True)
            self.assertFalse(os.path.exists("/dev/shm/" + name))
            self.assert_error(run("replay", "stat", name), "cannot open replay segment", name)
            self.assert_error(run("replay", "reset", name), name)
        finally:
            run("replay", "reset", name, "--force")

    def test_replay_errors_name_the_field(self):
        self.assert_error(run("replay", "create", "bad/name"), "replay segment name 'bad/name'",
                          "[A-Za-z0-9._-]")
        self.assert_error(run("replay", "create", "prl-cli-never", "--capacity-mb", 0),
                          "replay.capacity_mb: expected >= 1, found 0")
        self.assertFalse(os.path.exists("/dev/shm/prl-cli-never"))
        self.assert_error(run("replay", "serve", "prl-cli-missing-%d" % os.getpid()),
                          "cannot open replay segment")

    def test_bench_replay_prints_the_documented_json(self):
        proc = run("bench", "replay", "--record-bytes", "1024,65536", "--writers", 1,
                   "--readers", 1, "--mb-per-run", 2, "--json", check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "replay")
        names = [r["name"] for r in report["results"]]
        self.assertEqual(names, ["1KB_w1_r1_records", "1KB_w1_r1_bandwidth",
                                 "64KB_w1_r1_records", "64KB_w1_r1_bandwidth"])
        for r in report["results"]:
            self.assertGreater(r["value"], 0)
            if r["unit"] == "GB/s":
                self.assertEqual(r["baseline_name"], "memcpy")
                self.assertAlmostEqual(r["ratio"], r["value"] / r["baseline_value"], places=6)
        leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("prl-bench-replay-")]
        self.assertEqual(leftovers, [], "the bench removes its segments")


    def test_bench_coordinator_counts_only_durable_completions_and_no_failed_call(self):
        with tempfile.TemporaryDirectory() as work:
            proc = run("bench", "coordinator", "--actors", 4, "--seconds", 0.5, "--dir", work,
                       "--unrunnable", 1000, "--json", check=True)
            self.assertEqual(sorted(os.listdir(work)), [], "the bench removes its logs")
        leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("prl-bench-coordinator-")]
        self.assertEqual(leftovers, [], "the bench removes its tmpfs log")
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "coordinator")
        results = {r["name"]: r for r in report["results"]}
        self.assertGreater(results["completions_group_commit"]["value"], 0)
        self.assertGreater(results["completions_group_commit"]["baseline_value"], 0)
        # An fsync per request: one per completion record; group commit: at most that.
        self.assertAlmostEqual(results["fsyncs_per_completion"]["baseline_value"], 1.0, places=6)
        self.assertLessEqual(results["fsyncs_per_completion"]["value"], 1.0)
        # Every lease and completion succeeded: a refused call would be timed as a fast lease.
        self.assertEqual(results["errors_group_commit"]["value"], 0)
        self.assertEqual(results["errors_group_commit"]["baseline_value"], 0)
        self.assertGreater(results["lease_p50_group_commit"]["value"], 0)
        # The ceiling (log on tmpfs) ran too. The set no actor can run was queued first and never
        # leased (a completion of it, with too few rewards, would count as an error above).
        self.assertGreater(results["completions_tmpfs_ceiling"]["value"], 0)
        self.assertEqual(report["setup"]["unrunnable"].split()[0], "1000")

    def test_bench_coordinator_refuses_out_of_range_flags_naming_each(self):
        for flag, value, expected in [("--actors", 0, "1 to 4096"),
                                      ("--seconds", 601, "more than 0 and at most 600"),
                                      ("--samples", 513, "1 to 512"),
                                      ("--unrunnable", -1, "0 to 10000000")]:
            proc = run("bench", "coordinator", flag, value)
            self.assertNotEqual(proc.returncode, 0, flag)
            self.assertIn("%s: expected %s" % (flag, expected), proc.stderr)
            self.assertIn("found %s" % value, proc.stderr)

    def test_bench_broadcast_times_every_version_through_a_second_process(self):
        with tempfile.TemporaryDirectory() as work:
            proc = run("bench", "broadcast", "--configs", "tiny", "--versions", 2, "--batch", 4,
                       "--device", "cpu", "--work-dir", work, "--json", check=True)
            logs = sorted(os.listdir(work))
            # One subscriber process per transport, each saw its two swaps.
            self.assertEqual(len(logs), 2, logs)
            for log in logs:
                with open(os.path.join(work, log)) as f:
                    lines = [l.split() for l in f if l.startswith("swapped ")]
                self.assertEqual(len(lines), 2, log)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "broadcast")
        rows = {r["name"]: r for r in report["results"]}
        self.assertEqual(sorted(rows), sorted(
            "%s_tiny_%s" % (k, t) for k in ("publish_to_swapped", "publish", "swap_stall")
            for t in ("shm", "grpc")))
        for t in ("shm", "grpc"):
            swapped, publish = rows["publish_to_swapped_tiny_" + t], rows["publish_tiny_" + t]
            self.assertEqual(swapped["baseline_name"], "weight_copy")
            self.assertGreater(swapped["value"], 0)
            # Swapped includes the publish, the transfer and one engine step.
            self.assertGreaterEqual(swapped["value"], publish["value"])
            self.assertEqual(rows["swap_stall_tiny_" + t]["baseline_name"], "step_without_swap")
            self.assertGreater(rows["swap_stall_tiny_" + t]["baseline_value"], 0)
        leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("prl-bench-broadcast-")]
        self.assertEqual(leftovers, [], "the bench removes its segments")

    def test_bench_broadcast_refuses_bad_flags_naming_them(self):
        self.assert_error(run("bench", "broadcast", "--transports", "carrier-pigeon"),
                          "--transports: expected one of shm, grpc, cuda_ipc, nccl; found "
                          "'carrier-pigeon'")
        self.assert_error(run("bench", "broadcast", "--transports", "nccl"),
                          "--transports: nccl needs a process per GPU")
        self.assert_error(run("bench", "broadcast", "--batch", 0),
                          "--batch: expected 1 to 4096, found 0")
        self.assert_error(run("bench", "broadcast", "--versions", 5000),
                          "--versions: expected 1 to 1000, found 5000")


    def test_bench_e2e_flood_submits_its_sets_and_reports_every_tenants_share(self):
        # Two tenants, 20 steps of 16 groups each, no warm-start: t0 is sent 2 more sets of
        # 20 x 16 prompts once its adapter exists (about 12 s in all on 2 cores).
        proc = run("bench", "e2e", "--tenants", 2, "--flood", 3, "--json", "--run-dir",
                   self.path("bench-flood"), "--set", "learner.steps=20", "--set", "sft.steps=0",
                   "--set", "task.eval_prompts=10", check=True)
        report = json.loads(proc.stdout)
        self.assertEqual(report["bench"], "e2e --tenants --flood")
        self.assertIn("(640 prompts in 2 sets beside its run's)", report["setup"]["flood"])
        results = {r["name"]: r for r in report["results"]}
        for tenant in ("t0", "t1"):
            row = results["%s samples/s while all train, t0 flooding" % tenant]
            self.assertGreater(row["value"], 0)
            self.assertGreater(row["baseline_value"], 0)
        # Shares of the fair share: the tenants' rates over their mean, so they sum to 2.
        share0 = results["t0's share of the fair share, flooding"]["value"]
        share1 = results["others' least share of the fair share, t0 flooding"]["value"]
        self.assertAlmostEqual(share0 + share1, 2.0, places=6)

    def test_bench_e2e_tenants_refuses_bad_flags_naming_them(self):
        out = self.path("bench-e2e")
        self.assert_error(run("bench", "e2e", "--tenants", 1, "--flood", 10, "--run-dir", out),
                          "--flood: expected 2 to 100 (times the others' prompts) with --tenants 2 "
                          "or more, found 10 with --tenants 1")
        self.assert_error(run("bench", "e2e", "--tenants", 4, "--flood", 1, "--run-dir", out),
                          "--flood: expected 2 to 100", "found 1 with --tenants 4")
        self.assert_error(run("bench", "e2e", "--tenants", 65, "--run-dir", out),
                          "--tenants: expected 1 to 64 tenants, found 65")
        self.assert_error(run("bench", "e2e", "--tenants", 2, "--against", "two", "--run-dir", out),
                          "--against: expected separate or one, found 'two'")

if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
