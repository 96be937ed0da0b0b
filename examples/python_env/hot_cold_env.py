#!/usr/bin/python3
"""An example environment in Python: the "hot or cold" guessing game as a prl
EnvironmentService (proto/prl/v1/environment.proto; docs/environments.md).

The secret is the prompt's reference. Each model turn's last integer is a guess; the game
answers "hot" (closer than the previous guess) or "cold", and "higher" or "lower", as a user
message, with a turn reward of 0.1 for getting closer (a process reward); the episode ends with
reward 1 when the guess is right, or 0 when the guesses (parameter max_guesses, default the
actor's max_turns) run out. A truncated episode (EndEpisode) scores 0.

The words are parameters (hot_text, cold_text, higher_text, lower_text, separator, ask_text),
so that a model with a small vocabulary can read them: prl's built-in character tokenizer has
digits and "+-*=()# " only (tests/env/python_env_test.py plays with "*", "#", "+", "-", "").

Every call is idempotent, as the protocol asks: a retried StartEpisode keeps the episode, a
retried Step of the turn just answered gets the same answer, a retried EndEpisode the same score.
State is bounded: an aborted episode (EndEpisode with aborted: the actor gave it up) is forgotten
at once, and at most MAX_EPISODES are kept, the oldest finished ones forgotten first.

With --token-file, every call must carry `authorization: Bearer <the file's token>` (what an
actor sends when the operator lists this address in security.service_token_files); others are
refused UNAUTHENTICATED. Off loopback, serve it behind TLS: a bearer token in plaintext is
readable on the network.

Run it (Debian: python3-grpcio, python3-protobuf, protobuf-compiler):
    protoc -I proto --python_out=/tmp/prl_py proto/prl/v1/environment.proto
    PYTHONPATH=/tmp/prl_py python3 examples/python_env/hot_cold_env.py --port 7000
then point a prompt set at it: environment {name: "hot_cold", address: "127.0.0.1:7000"}
(the coordinator must list the address in coordinator.env_addresses), or try it by hand:
    prl env episode --address 127.0.0.1:7000 --reference 42 --turn 50 --turn 30 --turn 42
"""
import argparse
import collections
import hmac
import re
import threading
from concurrent import futures

import grpc
from prl.v1 import environment_pb2 as pb


MAX_EPISODES = 10000


class HotColdGame:
    def __init__(self, max_episodes=MAX_EPISODES):
        self.lock = threading.Lock()
        self.episodes = collections.OrderedDict()  # episode id -> state, oldest started first
        self.max_episodes = max_episodes

    def bound(self):
        """Forgets the oldest finished episodes first, then the oldest live ones."""
        while len(self.episodes) > self.max_episodes:
            finished = next((k for k, e in self.episodes.items() if e["finished"]), None)
            self.episodes.pop(finished if finished is not None else next(iter(self.episodes)))

    def StartEpisode(self, request, context):
        with self.lock:
            if request.episode_id not in self.episodes:  # a retried start keeps the episode
                try:
                    secret = int(request.reference)
                except ValueError:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  "reference: expected the secret number, found %r"
                                  % request.reference[:32])
                max_guesses = int(request.parameters.get("max_guesses", request.max_turns or 8))
                words = {key: request.parameters.get(key + "_text", default) for key, default in
                         (("hot", "hot"), ("cold", "cold"), ("higher", "higher"),
                          ("lower", "lower"), ("ask", "say a number"))}
                words["separator"] = request.parameters.get("separator", ", ")
                self.episodes[request.episode_id] = {
                    "secret": secret, "max_guesses": max_guesses, "guesses": 0,
                    "last_distance": None, "answers": {}, "end": None, "words": words,
                    "finished": False}
                self.bound()
        return pb.StartEpisodeResponse()

    def Step(self, request, context):
        with self.lock:
            e = self.episodes.get(request.episode_id)
            if e is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              "episode %r is unknown" % request.episode_id)
            if request.turn_index in e["answers"]:  # a retry: the same answer
                return e["answers"][request.turn_index]
            if request.turn_index != len(e["answers"]):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "turn_index %d out of order (expected %d)"
                              % (request.turn_index, len(e["answers"])))
            answer = self.play(e, request.text)
            e["answers"][request.turn_index] = answer
            e["finished"] = answer.done
            return answer

    @staticmethod
    def play(e, text):
        e["guesses"] += 1
        numbers = re.findall(r"-?\d+", text)
        answer = pb.StepResponse()
        if numbers and int(numbers[-1]) == e["secret"]:
            answer.done, answer.episode_reward = True, 1.0
            answer.done_reason = "solved in %d guesses" % e["guesses"]
            return answer
        if e["guesses"] >= e["max_guesses"]:
            answer.done, answer.episode_reward = True, 0.0
            answer.done_reason = "out of guesses (%d)" % e["max_guesses"]
            return answer
        words = e["words"]
        if not numbers:
            answer.messages.add(role="user", content=words["ask"])
            return answer
        guess = int(numbers[-1])
        distance = abs(guess - e["secret"])
        closer = e["last_distance"] is not None and distance < e["last_distance"]
        e["last_distance"] = distance
        answer.has_turn_reward, answer.turn_reward = True, 0.1 if closer else 0.0
        answer.messages.add(role="user", content=words["hot" if closer else "cold"] +
                            words["separator"] +
                            words["higher" if guess < e["secret"] else "lower"])
        return answer

    def EndEpisode(self, request, context):
        with self.lock:
            if request.aborted:  # given up by the actor: never trained, forget it now
                self.episodes.pop(request.episode_id, None)
                return pb.EndEpisodeResponse()
            e = self.episodes.get(request.episode_id)
            if e is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              "episode %r is unknown" % request.episode_id)
            if e["end"] is None:
                e["end"] = pb.EndEpisodeResponse(episode_reward=0.0)  # truncated: no credit
                e["finished"] = True
            return e["end"]


class BearerToken(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>` (compared in constant time)."""

    def __init__(self, token):
        self.expected = ("Bearer " + token).encode()

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")
        self.refusal = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation, details):
        sent = dict(details.invocation_metadata).get("authorization", "").encode()
        if hmac.compare_digest(sent, self.expected):
            return continuation(details)
        return self.refusal


def serve(port, host="127.0.0.1", token=None):
    game = HotColdGame()
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(game, name), request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString)
        for name, req, resp in (
            ("StartEpisode", pb.StartEpisodeRequest, pb.StartEpisodeResponse),
            ("Step", pb.StepRequest, pb.StepResponse),
            ("EndEpisode", pb.EndEpisodeRequest, pb.EndEpisodeResponse))}
    interceptors = [BearerToken(token)] if token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=interceptors)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("prl.v1.EnvironmentService", handlers),))
    bound = server.add_insecure_port("%s:%d" % (host, port))  # loopback: no TLS needed
    server.start()
    return server, bound


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7000, help="0 picks a free one")
    parser.add_argument("--token-file", help="callers must send this bearer token")
    args = parser.parse_args()
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    server, bound = serve(args.port, token=token)
    print("hot_cold environment on port %d" % bound, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
