#!/usr/bin/python3
"""The example environment in Python (examples/python_env/hot_cold_env.py) speaks prl's
EnvironmentService: prl's own client plays an episode against it (`prl env episode`, the
RemoteEnvironment the actors use, answers checked against the protocol), a retried turn gets
the same answer, and `prl run` trains the built-in arithmetic task as its game (the answer is
the secret; a wrong one gets hot/cold and higher/lower). Skips (exit 77) without
python3-grpcio / python3-protobuf / protoc.

usage: python_env_test.py PATH_TO_PRL [unittest args]
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


class PythonEnvironmentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import grpc  # noqa: F401
            import google.protobuf  # noqa: F401
        except ImportError as e:
            raise unittest.SkipTest("python3-grpcio / python3-protobuf missing: %s" % e)
        if shutil.which("protoc") is None:
            raise unittest.SkipTest("protoc missing")
        cls.tmp = tempfile.TemporaryDirectory(prefix="prl_python_env_")
        subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), "--python_out", cls.tmp.name,
                        os.path.join(ROOT, "proto/prl/v1/environment.proto")], check=True)
        sys.path.insert(0, cls.tmp.name)
        sys.path.insert(0, os.path.join(ROOT, "examples/python_env"))
        import hot_cold_env
        cls.env = hot_cold_env
        cls.server, cls.port = hot_cold_env.serve(0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)
        cls.tmp.cleanup()

    def episode(self, *turns, reference="42"):
        args = [PRL, "env", "episode", "--address", "127.0.0.1:%d" % self.port,
                "--environment", "hot_cold", "--reference", reference, "--max-turns", "4"]
        for t in turns:
            args += ["--turn", t]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def test_an_episode_through_prls_client_gets_feedback_turn_rewards_and_the_reward(self):
        lines = self.episode("my guess is 50", "then 40", "42!")
        self.assertEqual(lines[1]["answer"]["messages"][0]["content"], "cold, lower")
        self.assertEqual(lines[2]["answer"]["messages"][0]["content"], "hot, higher")
        self.assertEqual(lines[2]["answer"]["turn_reward"], 0.1)
        self.assertTrue(lines[3]["answer"]["done"])
        self.assertEqual(lines[3]["answer"]["episode_reward"], 1.0)
        self.assertEqual(lines[3]["answer"]["done_reason"], "solved in 3 guesses")

    def test_an_unfinished_episode_is_ended_and_scored_zero(self):
        lines = self.episode("10", reference="77")
        self.assertFalse(lines[1]["answer"].get("done", False))
        self.assertEqual(lines[-1]["end"].get("episode_reward", 0.0), 0.0)

    def test_a_retried_turn_gets_the_same_answer(self):
        import grpc
        pb = self.env.pb
        channel = grpc.insecure_channel("127.0.0.1:%d" % self.port)
        call = lambda name, req, resp: channel.unary_unary(  # noqa: E731
            "/prl.v1.EnvironmentService/" + name, request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString)
        start = call("StartEpisode", pb.StartEpisodeRequest, pb.StartEpisodeResponse)
        step = call("Step", pb.StepRequest, pb.StepResponse)
        start(pb.StartEpisodeRequest(episode_id="e", reference="5", max_turns=3))
        first = step(pb.StepRequest(episode_id="e", turn_index=0, text="9"))
        again = step(pb.StepRequest(episode_id="e", turn_index=0, text="9"))
        self.assertEqual(first, again)
        with self.assertRaises(grpc.RpcError) as out_of_order:
            step(pb.StepRequest(episode_id="e", turn_index=2, text="1"))
        self.assertEqual(out_of_order.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_an_aborted_episode_is_forgotten_and_state_stays_bounded(self):
        import grpc
        pb = self.env.pb
        game = self.env.HotColdGame(max_episodes=3)

        class Context:
            def abort(self, code, details):
                raise grpc.RpcError(details)
        start = lambda i: game.StartEpisode(  # noqa: E731
            pb.StartEpisodeRequest(episode_id="e%d" % i, reference="5"), Context())
        for i in range(3):
            start(i)
        game.EndEpisode(pb.EndEpisodeRequest(episode_id="e1", aborted=True), Context())
        self.assertEqual(list(game.episodes), ["e0", "e2"])
        game.Step(pb.StepRequest(episode_id="e0", turn_index=0, text="5"), Context())  # done
        for i in range(3, 5):
            start(i)  # e4 is over the bound: the finished e0 goes, not a live one
        self.assertEqual(list(game.episodes), ["e2", "e3", "e4"])
        start(5)  # nothing finished left: the oldest live one goes
        self.assertEqual(list(game.episodes), ["e3", "e4", "e5"])

    def test_a_token_file_admits_its_bearer_and_refuses_others(self):
        import grpc
        pb = self.env.pb
        server, port = self.env.serve(0, token="env-secret")
        try:
            def start(metadata):
                channel = grpc.insecure_channel("127.0.0.1:%d" % port)
                call = channel.unary_unary(
                    "/prl.v1.EnvironmentService/StartEpisode",
                    request_serializer=pb.StartEpisodeRequest.SerializeToString,
                    response_deserializer=pb.StartEpisodeResponse.FromString)
                return call(pb.StartEpisodeRequest(episode_id="t", reference="5"),
                            metadata=metadata)
            start([("authorization", "Bearer env-secret")])
            with self.assertRaises(grpc.RpcError) as refused:
                start([("authorization", "Bearer actor-token")])
            self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            with self.assertRaises(grpc.RpcError):
                start([])
        finally:
            server.stop(None)

    def test_prl_run_trains_against_the_python_environment(self):
        tmp = tempfile.mkdtemp(prefix="prl_python_env_run_")
        name = "t%d-python-env" % os.getpid()
        address = "127.0.0.1:%d" % self.port
        config = {
            "run": {"name": name, "dir": os.path.join(tmp, "run")},
            "task": {"eval_prompts": 40, "samples_per_prompt": 4},
            # The words in the character tokenizer's alphabet.
            "env": {"name": "hot_cold", "address": address, "max_turns": 4,
                    "params": {"hot_text": "*", "cold_text": "#", "higher_text": "+",
                               "lower_text": "-", "separator": "", "ask_text": "="}},
            "sft": {"steps": 150, "examples_per_step": 64},
            "learner": {"steps": 8, "groups_per_step": 4},
            "coordinator": {"listen": "127.0.0.1:0"},
            "broadcast": {"listen": "127.0.0.1:0"},
        }
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        try:
            out = subprocess.run([PRL, "run", "--config", path], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=900)
            self.assertEqual(out.returncode, 0, out.stdout[-5000:])
            with open(os.path.join(tmp, "run", "summary.json")) as f:
                summary = json.load(f)
            self.assertEqual(summary["environment"], "hot_cold")
            self.assertEqual(summary["steps"], 8)
            self.assertIn("hot_cold episodes:", out.stdout)
            # A model warm-started briefly answers wrong often: the game goes on, and the
            # learner trains on those episodes (the environment's replies as context).
            with open(os.path.join(tmp, "run", "learner_steps.jsonl")) as f:
                steps = [json.loads(line) for line in f]
            self.assertGreater(max(s["multi_turn_fraction"] for s in steps), 0, steps)
            self.assertGreater(summary["eval_turns_before"], 1.0, summary)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for shm in glob.glob("/dev/shm/prl-%s-*" % name):
                os.remove(shm)


if __name__ == "__main__":
    PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
