"""The rehearsal of a shared fleet of tenants (deploy/rehearse.sh --tenants; docs/tenants.md):
the cpu-dev overlay with components/tenants (mutual TLS from the overlay's components/security),
its actors in pods of their own, apart from the learner's: each adapter's versions reach them
from the learner's gRPC weight server, and their groups reach each adapter's replay segment in
the learner pod through the replay ingest (prl-replay). Two adapters' prompt sets submitted
through the coordinator's Service name, each adapter trained on its own groups, the accounting
of every prompt of both and of the actor pods that generated them.

main.py runs the fleet; this module holds the scenario and its report.
"""
import json
import random
import time

import observe

PROMPTS = 1600  # per adapter, a multiple of groups_per_step (cpu-dev: 16)
SAMPLES, MAX_TOKENS = 8, 48
ACTORS = 2  # actor pods (the actor Deployment's replicas), each in its own network namespace
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


def report(result, adapters, stats, totals, coordinator_metrics, learner_metrics, actors,
           learner):
    """Prints each adapter's accounting and the actor pods', and raises SystemExit when a prompt
    is unaccounted for or the actors did not run in pods of their own.
    adapters: `prl adapter list --json`; stats[name]: its replay segment's `prl replay stat`;
    totals[name]: (steps, groups trained, handed back, duplicates) from its report file;
    coordinator_metrics, learner_metrics: their /metrics (the adapter's series; the prompts
    leased to each actor); actors: {actor pod name: its IP}; learner: the learner's pod (rank 0),
    whose /dev/shm holds the segments."""
    by_name = {a["name"]: a for a in adapters}
    problems = []
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
        print("adapter %s (%s, rank %d): set %s done in %.0f s, %d/%d prompts; version %s" % (
            name, a["adapter_id"], rank, result["sets"][name], seconds, s["prompts_done"],
            s["prompts_total"], a.get("version", 0)))
        print("  groups written to its replay: %d; trained %d in %d steps, dropped as stale %d, "
              "handed back %d, second groups %d, left %d" % (written, trained, steps, dropped,
                                                             handed_back, duplicates, left))
        version = coordinator_metrics.get('prl_adapter_version{adapter="%s"}' % name)
        learner_steps = learner_metrics.get('prl_adapter_learner_steps_total{adapter="%s"}' % name)
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
    # The actors are pods of their own: their groups reached the segments in the learner pod's
    # /dev/shm through the replay ingest, their versions came over gRPC (no shared memory).
    leased = {k.split('"')[1]: v for k, v in coordinator_metrics.items()
              if k.startswith("prl_prompts_leased_total{")}
    print("\n== actor pods (the learner pod %s is at %s)" % (learner.name, learner.ip))
    for name, ip in sorted(actors.items()):
        print("  prompts leased to %-34s %-15s %5d" % (name, ip, leased.get(name, 0)))
        if ip == learner.ip:
            problems.append("actor pod %s shares the learner pod's network" % name)
        if not leased.get(name):
            problems.append("actor pod %s was leased no prompt" % name)
    if len(actors) != ACTORS:
        problems.append("%d actor pods, expected %d" % (len(actors), ACTORS))
    print("\nrehearsal (tenants): %s" % ("; ".join(problems) or "every prompt of both adapters accounted for"))
    if problems:
        raise SystemExit(1)


def metrics_of(pod):
    return observe.scrape(pod.ip, 9400)
