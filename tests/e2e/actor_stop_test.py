#!/usr/bin/python3
"""SIGTERM to an actor while its agents' calls are in flight: the actor exits 0, three times in a
row (docs/security.md, "Boundaries"; issue: the endpoint's sessions outlived its server).

The pipeline as separate processes on loopback (coordinator, learner, one actor at a time) and an
agent written from docs/agents.md alone: a gRPC AgentService in Python (python3-grpcio, the
messages from proto/prl/v1/agent.proto by protoc) that, for each episode, calls the actor's
OpenAI-compatible endpoint with its key and writes a line to a file once the call is sent. Each
round starts an actor, waits until four of its episodes have a call in flight (the agent's
lines: an event, not a clock), sends SIGTERM, and requires exit status 0 and no sanitizer or
terminate report in its log. The coordinator hands the prompts of a stopped actor to the next.

usage: actor_stop_test.py PATH_TO_PRL [unittest args]
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from concurrent import futures

import e2e_util
from e2e_util import free_port, tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRL = None
ROUNDS = 3
CALLS = 4


class Agent:
    """RunEpisode: one call to the endpoint, then reward 1; a line in `calls` per call sent."""

    def __init__(self, pb, calls_path):
        self.pb = pb
        self.calls_path = calls_path
        self.lock = threading.Lock()

    def RunEpisode(self, request, context):
        body = json.dumps({"model": request.model, "prompt": "1", "max_tokens": 8}).encode()
        call = urllib.request.Request(
            request.base_url + "/completions", data=body, method="POST",
            headers={"Authorization": "Bearer " + request.api_key,
                     "Content-Type": "application/json"})
        with self.lock, open(self.calls_path, "a") as f:
            f.write(request.episode_id + "\n")
        try:
            urllib.request.urlopen(call, timeout=60).read()
        except Exception:  # the actor stopped mid-call: expected here
            pass
        return self.pb.RunEpisodeResponse(reward=1.0)


class ActorStopTest(unittest.TestCase):
    def setUp(self):
        try:
            import grpc
        except ImportError as e:
            raise unittest.SkipTest("python3-grpcio missing: %s" % e)
        self.tmp = tempfile.TemporaryDirectory(prefix="prl_actor_stop_")
        self.work = self.tmp.name
        subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), "--python_out", self.work,
                        "prl/v1/agent.proto", "prl/v1/prompt.proto", "prl/v1/replay.proto"],
                       check=True,
                       cwd=ROOT)
        sys.path.insert(0, self.work)
        from prl.v1 import agent_pb2 as pb
        self.calls = os.path.join(self.work, "calls.txt")
        agent = Agent(pb, self.calls)
        handler = grpc.method_handlers_generic_handler("prl.v1.AgentService", {
            "RunEpisode": grpc.unary_unary_rpc_method_handler(
                agent.RunEpisode, request_deserializer=pb.RunEpisodeRequest.FromString,
                response_serializer=pb.RunEpisodeResponse.SerializeToString)})
        self.agent = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self.agent.add_generic_rpc_handlers((handler,))
        agent_port = self.agent.add_insecure_port("127.0.0.1:0")
        self.agent.start()
        self.agent_address = "127.0.0.1:%d" % agent_port
        model = os.path.join(self.work, "model")
        tiny_model(model)
        self.port = free_port()
        self.tag = "actorstop-%d" % os.getpid()
        cfg = {
            "run": {"name": self.tag, "dir": self.work},
            "model": {"path": model},
            "coordinator": {"listen": "127.0.0.1:%d" % self.port, "lease_ms": 2000,
                            "heartbeat_ms": 300, "agent_addresses": [self.agent_address]},
            "learner": {"steps": 1000, "groups_per_step": 1, "lr": 1e-3},
            "actors": {"max_prompts_in_flight": 2, "kv_cache_mb": 16},
        }
        self.config = os.path.join(self.work, "config.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.prompts = os.path.join(self.work, "prompts.jsonl")
        with open(self.prompts, "w") as f:
            for i in range(64):
                f.write(json.dumps({"text": "(1+2)=", "reference": "3"}) + "\n")
        self.procs = {}

    def tearDown(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.agent.stop(None)
        e2e_util.run("replay", "reset", "prl-%s-replay" % self.tag, "--force")
        weights = "/dev/shm/prl-%s-weights" % self.tag
        if os.path.exists(weights):
            os.remove(weights)
        self.tmp.cleanup()

    def start(self, name, *args):
        with open(os.path.join(self.work, name + ".log"), "a") as log:
            self.procs[name] = subprocess.Popen([PRL, *map(str, args)], stdout=log,
                                                stderr=subprocess.STDOUT, text=True)

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def wait_until(self, done, what, timeout=180):
        deadline = time.time() + timeout  # a fail-safe; the wait ends on the event
        while not done():
            self.assertLess(time.time(), deadline, what)
            time.sleep(0.02)

    def calls_sent(self):
        if not os.path.exists(self.calls):
            return 0
        with open(self.calls) as f:
            return sum(1 for _ in f)

    def test_an_actor_stopped_while_agents_call_exits_zero_three_times(self):
        self.start("coordinator", "coordinator", "--config", self.config)
        self.wait_until(lambda: "coordinator on port" in self.log("coordinator"),
                        "the coordinator did not start")
        self.start("learner", "learner", "serve", "--config", self.config)
        e2e_util.run("submit", self.prompts, "--server", "127.0.0.1:%d" % self.port,
                     "--samples", 2, "--max-tokens", 8, "--agent-address", self.agent_address,
                     "--agent", "stop-test", check=True)
        for round_ in range(ROUNDS):
            name = "actor%d" % round_
            before = self.calls_sent()
            self.start(name, "actor", "--config", self.config, "--name", name)
            self.wait_until(lambda: self.calls_sent() >= before + CALLS or
                            self.procs[name].poll() is not None,
                            "round %d: no %d calls in flight:\n%s" % (round_, CALLS,
                                                                      self.log(name)[-3000:]))
            self.assertIsNone(self.procs[name].poll(), self.log(name)[-3000:])
            self.procs[name].send_signal(signal.SIGTERM)
            status = self.procs[name].wait(timeout=120)
            log = self.log(name)
            self.assertEqual(status, 0, "round %d: %s" % (round_, log[-3000:]))
            for report in ("AddressSanitizer", "runtime error:", "terminate called"):
                self.assertNotIn(report, log, "round %d" % round_)


if __name__ == "__main__":
    PRL = e2e_util.PRL = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import skip_aware_main  # noqa: E402 (tests/skip_aware_main.py)
    sys.exit(skip_aware_main.main())
