"""The rehearsal of a shared fleet of tenants (deploy/rehearse.sh --tenants; docs/tenants.md):
the cpu-dev overlay with components/tenants (mutual TLS from the overlay's components/security)
and two learner pods (ranks), its actors in pods of their own, apart from the learners': each
adapter is placed on one rank, its versions reach the actors from that rank's gRPC weight server
and their groups reach its replay segment in that rank's pod through the replay ingest beside
it (prl-learner-{rank}.prl-learner). Two adapters' prompt sets submitted through the
coordinator's Service name, each adapter trained on its own groups by its own rank, each rank's
ingest writing only its adapter's groups, the accounting of every prompt of both and of the
actor pods that generated them.

main.py runs the fleet; this module holds the scenario and its report.
"""
import json
import random
import time

import observe

PROMPTS = 1600  # per adapter, a multiple of groups_per_step (cpu-dev: 16)
SAMPLES, MAX_TOKENS = 8, 48
ACTORS = 2  # actor pods (the actor Deployment's replicas), each in its own network namespace
LEARNER_RANKS = 2  # learner pods: the coordinator places math on rank 0 and code on rank 1
INGEST_METRICS_PORT = 9401  # the replay ingest container's /metrics in each learner pod
# Each adapter's own task (the built-in arithmetic reward scores both), and its settings:
# math takes the fleet's defaults (prl-run tenants_lora_*), code names its own rank.
ADAPTERS = (("math", "+", []), ("code", "-", ["--adapter-rank", "8"]))


def prompt_files():
    """{file name: JSONL} of each adapter's prompts, for the rehearsal's ConfigMap."""
    rng = random.Random(11)
    files = {}
    for name, op, _ in ADAPTERS:
        lines = []
        for _ in range(PROMPTS):
            a, b = sorted((rng.randrange(100), rng.randrange(100)), reverse=True)
            answer = a + b if op == "+" else a - b
            lines.append(json.dumps({"text": "%d%s%d=" % (a, op, b), "reference": str(answer)}))
        files["%s.jsonl" % name] = "\n".join(lines) + "\n"
    return files


def scenario(client, status):
    """Submits each adapter's set (the first names the adapter and makes it); waits until both
    are done. `client(args)` runs prl in a client pod, `status(set_id)` is the set's status."""
    sets = {}
    for name, _, settings in ADAPTERS:
        out = client(["submit", "/prompts/%s.jsonl" % name, "--server", "prl-coordinator:50051",
                      "--adapter", name] + settings +
                     ["--samples", str(SAMPLES), "--max-tokens", str(MAX_TOKENS), "--stop-token", "2",
                      "--reward", "arithmetic", "--json"])
        sets[name] = json.loads(out.splitlines()[0])["prompt_set_id"]
        print("submitted %d prompts for adapter %s as %s" % (PROMPTS, name, sets[name]), flush=True)
    submitted = time.time()
    deadline = submitted + 480
    done = {}
    while len(done) < len(sets):
        for name, set_id in sets.items():
            if name not in done:
                s = status(set_id)
                if s["state"] == "done":
                    done[name] = (s, time.time() - submitted)
                    print("%5.0f s: adapter %s's set done" % (done[name][1], name), flush=True)
        if time.time() > deadline:
            raise RuntimeError("the adapters' sets did not finish: %s" % sorted(set(sets) - set(done)))
        time.sleep(1)
    return {"sets": sets, "done": done}


def report(result, adapters, stats, totals, coordinator_metrics, learner_metrics, ingest_metrics,
           actors, learners):
    """Prints each adapter's accounting and the actor pods', and raises SystemExit when a prompt
    is unaccounted for, an adapter was not trained by its own rank, or the actors did not run in
    pods of their own.
    adapters: `prl adapter list --json`; stats[name]: its replay segment's `prl replay stat` (in
    its rank's pod); totals[name]: (steps, groups trained, handed back, duplicates) from its
    report file; coordinator_metrics: the coordinator's /metrics (the adapter's series; the
    prompts leased to each actor); learner_metrics[r], ingest_metrics[r]: rank r's learner's and
    replay ingest's; actors: {actor pod name: its IP}; learners: the learner pods by rank."""
    by_name = {a["name"]: a for a in adapters}
    problems = []
    expected_rank = {name: i % len(learners) for i, (name, _, _) in enumerate(ADAPTERS)}
    print("\n== accounting, per adapter")
    for name, _, settings in ADAPTERS:
        s, seconds = result["done"][name]
        a = by_name.get(name)
        if a is None:
            problems.append("the coordinator lists no adapter %s" % name)
            continue
        stat = stats[name]
        steps, trained, handed_back, duplicates = totals[name]
        written, dropped = stat["groups_in"], stat["dropped_stale"]
        left = stat["groups_ready"] + stat["groups_leased"]
        rank = a["rank"]
        learner_rank = a.get("learner_rank", 0)
        print("adapter %s (%s, rank %d): set %s done in %.0f s, %d/%d prompts; version %s; "
              "learner rank %d (%s)" % (
                  name, a["adapter_id"], rank, result["sets"][name], seconds, s["prompts_done"],
                  s["prompts_total"], a.get("version", 0), learner_rank,
                  learners[learner_rank % len(learners)].name))
        if learner_rank != expected_rank[name]:
            problems.append("adapter %s: placed on learner rank %d, expected %d (the least loaded)"
                            % (name, learner_rank, expected_rank[name]))
        print("  groups written to its replay: %d; trained %d in %d steps, dropped as stale %d, "
              "handed back %d, second groups %d, left %d" % (written, trained, steps, dropped,
                                                             handed_back, duplicates, left))
        version = coordinator_metrics.get('prl_adapter_version{adapter="%s"}' % name)
        own = learner_metrics[learner_rank % len(learners)]
        learner_steps = own.get('prl_adapter_learner_steps_total{adapter="%s"}' % name)
        for other, m in enumerate(learner_metrics):
            if other != learner_rank and m.get('prl_adapter_learner_steps_total{adapter="%s"}' % name):
                problems.append("adapter %s: learner rank %d trained it too" % (name, other))
        print("  prl_adapter_version{adapter=\"%s\"} at the coordinator: %s; "
              "prl_adapter_learner_steps_total at the learner: %s" % (name, version, learner_steps))
        if learner_steps != steps:
            problems.append("adapter %s: the learner's metrics count %s steps, its reports %d" % (
                name, learner_steps, steps))
        if s["state"] != "done" or s["prompts_done"] != PROMPTS or s["prompts_total"] != PROMPTS:
            problems.append("adapter %s: the coordinator did not complete every prompt: %s" % (name, s))
        if written < PROMPTS or trained + dropped + handed_back + duplicates + left != written:
            problems.append("adapter %s's replay: %d written but %d trained + %d dropped + %d handed back "
                            "+ %d duplicates + %d left" % (name, written, trained, dropped, handed_back,
                                                           duplicates, left))
        if steps < 1 or int(a.get("version", 0)) < 1 or version is None or version < 1:
            problems.append("adapter %s was never trained (version %s)" % (name, a.get("version")))
        if settings and rank != int(settings[-1]):
            problems.append("adapter %s: rank %d, its set asked for %s" % (name, rank, settings[-1]))
    # Each rank pod's ingest wrote exactly the groups of the adapters placed on its rank.
    print("\n== replay ingest of each learner rank")
    for r, m in enumerate(ingest_metrics):
        ingested = m.get("prl_replay_ingest_groups_total")
        own = [name for name, _, _ in ADAPTERS if name in by_name
               and by_name[name].get("learner_rank", 0) % len(learners) == r]
        written = sum(stats[name]["groups_in"] for name in own)
        print("  rank %d (%s): prl_replay_ingest_groups_total %s; its adapters %s took in %d" % (
            r, learners[r].name, ingested, ", ".join(own) or "none", written))
        if ingested != written:
            problems.append("rank %d's replay ingest wrote %s groups, its adapters' replays took in %d"
                            % (r, ingested, written))
    # The actors are pods of their own: their groups reached the segments in the learner pods'
    # /dev/shm through the replay ingests, their versions came over gRPC (no shared memory).
    leased = {k.split('"')[1]: v for k, v in coordinator_metrics.items()
              if k.startswith("prl_prompts_leased_total{")}
    print("\n== actor pods (the learner pods: %s)" % ", ".join("%s at %s" % (p.name, p.ip) for p in learners))
    for name, ip in sorted(actors.items()):
        print("  prompts leased to %-34s %-15s %5d" % (name, ip, leased.get(name, 0)))
        if ip in {p.ip for p in learners}:
            problems.append("actor pod %s shares a learner pod's network" % name)
        if not leased.get(name):
            problems.append("actor pod %s was leased no prompt" % name)
    if len(actors) != ACTORS:
        problems.append("%d actor pods, expected %d" % (len(actors), ACTORS))
    print("\nrehearsal (tenants): %s" % ("; ".join(problems) or "every prompt of both adapters accounted for"))
    if problems:
        raise SystemExit(1)


def metrics_of(pod, port=9400):
    return observe.scrape(pod.ip, port)
