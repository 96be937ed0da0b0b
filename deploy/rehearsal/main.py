#!/usr/bin/python3
"""The rehearsal (deploy/rehearse.sh runs it; docs/deploy.md, "Rehearsal"): the cpu-dev overlay
rendered with `kubectl kustomize`, every container of it run as a process by kubelet.py in its
pod's namespaces, the controllers' pods (StatefulSet ordinals, Deployment replicas), Secrets
from deploy/k8s/make-secrets.sh (the overlay's fleet speaks mutual TLS with role tokens); a prompt
set submitted through the coordinator's Service name from a client pod with the client's token,
CA and certificate, the actors scaled 1 -> 3 -> 1 while it runs, the accounting of every prompt;
then the dashboard's and the alert rules' queries against Prometheus, which scraped it all.

With --tenants: the shared fleet of tenants' adapters instead (components/tenants on the
overlay with two learner pods, mutual TLS as its components/security sets it;
deploy/rehearsal/tenants.py): the actors in pods of their own (other network namespaces and
/dev/shm than the learners'), each adapter placed on one learner rank, its versions from that
rank's gRPC weight server and its groups through the replay ingest in that rank's pod; two
adapters' sets, each adapter trained on its own groups by its own rank, every prompt of both
accounted for.

usage: main.py PATH_TO_PRL RUN_ID [--tenants]       (root: namespaces, mounts)
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml

import cluster
import kubelet
import network
import observe
import tenants

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROMPTS = 12000  # a multiple of groups_per_step (cpu-dev: 16); about two minutes of generation here
EVAL_PROMPTS = 32  # an evaluation set beside it: greedy, a round every 20 learner versions
SAMPLES, MAX_TOKENS = 8, 48


# The learner's replica count in an overlay of yours, and what follows it (the cpu-dev overlay's
# replacements, again after the new count).
LEARNER_RANKS_KUSTOMIZATION = """replicas: [{name: prl-learner, count: %d}]
replacements:
  - source: {kind: StatefulSet, name: prl-learner, fieldPath: spec.replicas}
    targets:
      - select: {kind: StatefulSet, name: prl-learner}
        fieldPaths:
          - spec.template.spec.containers.[name=learner].env.[name=WORLD_SIZE].value
      - select: {kind: StatefulSet, name: prl-coordinator}
        fieldPaths:
          - spec.template.spec.containers.[name=coordinator].env.[name=LEARNER_WORLD_SIZE].value
"""


class Fleet:
    """The controllers: workloads become pods; scaling a Deployment adds or deletes pods."""

    def __init__(self, objects, index, kube, prometheus_ref):
        self.objects, self.index, self.kube = objects, index, kube
        self.prometheus = prometheus_ref
        self.by_owner = {}

    def pods(self):
        with self.kube.lock:
            return list(self.kube.pods.values())

    def refresh_names(self):
        """Every pod's hosts file (cluster DNS) and Prometheus's targets, after a change."""
        live = [p.obj for p in self.pods()]
        names = cluster.dns_names(self.objects, live)
        for p in self.pods():
            network.write_hosts(p.hosts_file, p.name, p.ip, names)
        if self.prometheus:
            self.prometheus[0].write_targets(observe.sd_targets([p for p in self.pods() if p.phase == "Running"]))

    def add(self, workload, count):
        new = []
        for _ in range(count):
            owned = self.by_owner.setdefault(workload["metadata"]["name"], [])
            ordinal = len(owned) if workload["kind"] == "StatefulSet" else None
            pod = self.kube.create(cluster.pod_from(workload, ordinal))
            owned.append(pod.name)
            new.append(pod)
        self.refresh_names()
        threads = [threading.Thread(target=self.kube.start, args=(p,)) for p in new]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.refresh_names()
        return new

    def scale(self, name, replicas):
        workload = self.index[("Deployment", name)]
        owned = self.by_owner.setdefault(name, [])
        if replicas > len(owned):
            self.add(workload, replicas - len(owned))
        while len(owned) > replicas:
            self.kube.delete(owned.pop())  # the newest first, as a ReplicaSet scales down
        self.refresh_names()

    def wait_ready(self, pods, timeout_s=240):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if all(p.ready() for p in pods):
                return
            time.sleep(0.5)
        raise RuntimeError("not ready in %d s: %s" % (timeout_s, [p.name for p in pods if not p.ready()]))


def client_trust(objects):
    """What a client needs to reach the coordinator as the rendered fleet configures it: the
    client Secrets to mount and the `prl submit`/`prl status` flags that use them (the client
    token, the CA, the client certificate for mutual TLS), from the coordinator's settings."""
    coordinator = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "prl-coordinator")
    args = next(c for c in coordinator["spec"]["template"]["spec"]["containers"] if c["name"] == "coordinator")["args"]
    settings = dict(a.split("=", 1) for a in args if a.startswith("security."))
    volumes, mounts, flags = [], [], []
    if settings.get("security.tls_cert_file"):
        volumes.append({"name": "tls", "secret": {"secretName": "prl-tls-client", "defaultMode": 0o440}})
        mounts.append({"name": "tls", "mountPath": "/etc/prl/tls", "readOnly": True})
        flags += ["--ca-file", "/etc/prl/tls/ca.crt"]
        if settings.get("security.require_client_cert") == "true":
            flags += ["--cert-file", "/etc/prl/tls/tls.crt", "--key-file", "/etc/prl/tls/tls.key"]
    if settings.get("security.client_token_file"):
        volumes.append({"name": "tokens", "secret": {"secretName": "prl-tokens", "defaultMode": 0o440,
                                                     "items": [{"key": "client", "path": "client"}]}})
        mounts.append({"name": "tokens", "mountPath": "/etc/prl/tokens", "readOnly": True})
        flags += ["--token-file", "/etc/prl/tokens/client"]
    return volumes, mounts, flags


def client(kube, fleet, args):
    """Runs `prl ARGS` in a client pod (labelled prl.dev/client=true) with the client's Secrets
    and trust flags (client_trust) and returns its stdout."""
    volumes, mounts, flags = client_trust(fleet.objects)
    spec = {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
            "volumes": [{"name": "prompts", "configMap": {"name": "rehearsal-prompts"}}] + volumes,
            "containers": [{"name": "prl", "command": ["prl"], "args": args + flags,
                            "securityContext": {"readOnlyRootFilesystem": True,
                                                "allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "prompts", "mountPath": "/prompts"}] + mounts}]}
    obj = {"metadata": {"name": "client-%06d" % random.randrange(10 ** 6), "namespace": "prl",
                        "labels": {"prl.dev/client": "true"}, "owner": "client"}, "spec": spec}
    pod = kubelet.Pod(kube, obj)
    try:
        network.write_hosts(pod.hosts_file, pod.name, pod.ip,
                            cluster.dns_names(fleet.objects, [p.obj for p in fleet.pods()]))
        c = pod.containers[0]
        c.start()
        code = c.proc.wait(timeout=60)
        out = open(c.log_path).read().split("\n", 1)[1]
        if code != 0:
            raise RuntimeError("prl %s failed (%d): %s" % (" ".join(args), code, out))
        return out
    finally:
        kube.network.remove_pod(pod.name)


def exec_in(pod, container, args):
    """`kubectl exec POD -c CONTAINER -- prl ARGS`: a process with the container's mounts,
    user and environment in the pod's namespaces; returns its stdout."""
    spec = dict(next(c for c in pod.spec["containers"] if c["name"] == container))
    spec = {k: v for k, v in spec.items() if not k.endswith("Probe")}
    spec.update(name="exec-%06d" % random.randrange(10 ** 6), args=args)
    c = kubelet.Container(pod, spec, False)
    c.start()
    code = c.proc.wait(timeout=60)
    out = open(c.log_path).read().split("\n", 1)[1]
    if code != 0:
        raise RuntimeError("exec %s in %s failed (%d): %s" % (args, pod.name, code, out))
    return out


def security_report(fleet):
    """What each role process says protects it (its `security:` start line: TLS or plaintext,
    whose tokens it checks, which it sends; never a token), and the containers that do not
    speak mutual TLS although the rendered fleet configures it."""
    secure = bool(client_trust(fleet.objects)[2])
    lines, problems = [], []
    for pod in sorted(fleet.pods(), key=lambda p: p.name):
        for c in pod.containers:
            said = [l.split("security: ", 1)[1].strip() for l in open(c.log_path) if l.startswith("security: ")]
            lines.append("  %-34s %-12s %s" % (pod.name, c.name, said[-1] if said else "(no security line)"))
            if secure and not (said and said[-1].startswith("mutual TLS")):
                problems.append("%s/%s does not serve mutual TLS" % (pod.name, c.name))
    return lines, problems


def prompts_configmap(index):
    rng = random.Random(7)
    lines = []
    for _ in range(PROMPTS):
        a, b = rng.randrange(100), rng.randrange(100)
        lines.append(json.dumps({"text": "%d+%d=" % (a, b), "reference": str(a + b)}))
    # Held-out prompts for an evaluation set (docs/operations.md, "Evaluation during training").
    held_out = []
    for _ in range(EVAL_PROMPTS):
        a, b = rng.randrange(100), rng.randrange(100)
        held_out.append(json.dumps({"text": "%d+%d=" % (a, b), "reference": str(a + b)}))
    data = {"prompts.jsonl": "\n".join(lines) + "\n", "eval.jsonl": "\n".join(held_out) + "\n"}
    data.update(tenants.prompt_files())  # the tenants rehearsal's
    index[("ConfigMap", "rehearsal-prompts")] = {"data": data}


def render(work, components=(), learner_ranks=1):
    """The cpu-dev overlay, with `components` (of deploy/k8s/components) on it and `learner_ranks`
    learner pods (as your overlay sets them: the replica count, WORLD_SIZE and the coordinator's
    LEARNER_WORLD_SIZE after it), and its Secrets."""
    overlay = os.path.join(REPO, "deploy/k8s/overlays/cpu-dev")
    if components or learner_ranks != 1:
        here = os.path.join(work, "kustomization")
        os.makedirs(here)
        with open(os.path.join(here, "kustomization.yaml"), "w") as f:
            f.write("resources: [%s]\ncomponents:\n" % os.path.relpath(overlay, here))
            for c in components:
                f.write("  - %s\n" % os.path.relpath(os.path.join(REPO, "deploy/k8s/components", c), here))
            if learner_ranks != 1:
                f.write(LEARNER_RANKS_KUSTOMIZATION % learner_ranks)
        overlay = here
    rendered = subprocess.run(["kubectl", "kustomize", overlay], check=True, capture_output=True, text=True).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    namespace = objects[0]["metadata"].get("namespace", "prl")
    subprocess.run(["bash", os.path.join(REPO, "deploy/k8s/make-secrets.sh"), os.path.join(work, "secrets"), namespace],
                   check=True, capture_output=True)
    secrets = [o for o in yaml.safe_load_all(open(os.path.join(work, "secrets", "secrets.yaml"))) if o]
    objects += secrets
    _, index = cluster.load_objects(json.dumps(objects))
    kinds = {}
    for o in objects:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    print("rendered cpu-dev%s: %s (Secrets from make-secrets.sh)" % (
        "".join(" + " + c for c in components), ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items()))))
    return objects, index


def status(kube, fleet, set_id):
    return json.loads(client(kube, fleet, ["status", set_id, "--server", "prl-coordinator:50051", "--json"]))[0]


def run(prl, run_id, work, with_tenants=False):
    start = time.time()
    objects, index = (render(work, ("tenants",), tenants.LEARNER_RANKS) if with_tenants
                      else render(work))
    prompts_configmap(index)
    net = network.Network(run_id, "10.250.%d.0/24" % (int(run_id) % 200 + 20))
    net.create()
    events = []
    kube = kubelet.Kubelet(work, prl, index, net, events)
    prometheus_ref = []
    fleet = Fleet(objects, index, kube, prometheus_ref)
    try:
        workloads = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]
        for w in workloads:  # every workload at once, as `kubectl apply` would
            threading.Thread(target=fleet.add, args=(w, w["spec"].get("replicas", 1))).start()
        time.sleep(1)
        deadline = time.time() + 60
        while sum(len(v) for v in fleet.by_owner.values()) < sum(w["spec"].get("replicas", 1) for w in workloads):
            if time.time() > deadline:
                raise RuntimeError("pods were not created")
            time.sleep(0.2)
        fleet.wait_ready(fleet.pods())
        if with_tenants:  # the adapters' actors: pods of the actor Deployment, not the learner's
            fleet.scale("prl-actor", tenants.ACTORS)
            fleet.wait_ready(fleet.pods())
        print("fleet ready in %.0f s: %s" % (time.time() - start, ", ".join("%s (%s)" % (p.name, p.ip) for p in fleet.pods())), flush=True)
        lines, problems = security_report(fleet)
        print("security of each process, as it says at start:\n" + "\n".join(lines), flush=True)
        if problems:
            raise RuntimeError("; ".join(problems))
        if with_tenants:
            result = tenants.scenario(lambda args: client(kube, fleet, args),
                                      lambda set_id: status(kube, fleet, set_id))
            report_tenants(kube, fleet, result)
            return
        prometheus_ref.append(observe.Prometheus(REPO, work, 19090 + int(run_id) % 1000))
        fleet.refresh_names()
        scenario = scale_during_run(kube, fleet)
        report(kube, fleet, prometheus_ref[0], scenario, start)
    finally:
        if prometheus_ref:
            prometheus_ref[0].stop()
        kube.shutdown()
        net.destroy()
        shutil.rmtree(kube.shm, ignore_errors=True)


def leased_by(kube, fleet, actor):
    """Prompts the coordinator has leased to `actor` (its pod name), from its /metrics."""
    coordinator = next(p for p in fleet.pods() if p.name == "prl-coordinator-0")
    metrics = observe.scrape(coordinator.ip, 9400)
    return sum(v for k, v in metrics.items()
               if k.startswith("prl_prompts_leased_total{") and k.split('"')[1] == actor)


def scale_during_run(kube, fleet):
    """Submits the prompt set (and an evaluation set) through the Service name; scales the actors
    1 -> 3 -> 1 on the way."""
    client(kube, fleet, ["submit", "/prompts/eval.jsonl", "--server", "prl-coordinator:50051",
                         "--name", "rehearsal-eval", "--eval-every", "20", "--samples", "1",
                         "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--stop-token", "2",
                         "--reward", "arithmetic", "--json"])
    out = client(kube, fleet, ["submit", "/prompts/prompts.jsonl", "--server", "prl-coordinator:50051",
                               "--samples", str(SAMPLES), "--max-tokens", str(MAX_TOKENS), "--stop-token", "2",
                               "--reward", "arithmetic", "--json"])
    set_id = json.loads(out.splitlines()[0])["prompt_set_id"]
    submitted = time.time()
    trust = client_trust(fleet.objects)[2]
    print("submitted %d prompts as %s through prl-coordinator:50051 (%s)" % (
        PROMPTS, set_id, " ".join(trust) or "plaintext, no token"), flush=True)
    steps = [(0.2, 3), (0.6, 1)]
    scaled = []
    deadline = time.time() + 480
    while True:
        s = status(kube, fleet, set_id)
        if s["state"] == "done":
            break
        if time.time() > deadline:
            raise RuntimeError("the prompt set did not finish: %s" % s)
        # The next step waits for the last one to take effect (every actor it left has been
        # leased prompts), and for the set's progress: never for the clock, which ran out on
        # fast machines (a set done before a fixed delay was over was never scaled down).
        settled = not scaled or all(leased_by(kube, fleet, actor) > 0 for actor in scaled[-1][3])
        if steps and s["prompts_done"] >= steps[0][0] * PROMPTS and settled:
            fraction, replicas = steps.pop(0)
            t = time.time()
            fleet.scale("prl-actor", replicas)
            if replicas > 1:
                fleet.wait_ready(fleet.pods())
            actors = sorted(fleet.by_owner["prl-actor"])
            scaled.append((t - submitted, s["prompts_done"], replicas, actors))
            print("%5.0f s: %d/%d done; actors scaled to %d (%s)" % (t - submitted, s["prompts_done"], PROMPTS, replicas, ", ".join(actors)), flush=True)
        time.sleep(1)
    return {"set": set_id, "status": s, "submitted": submitted, "done_at": time.time(), "scaled": scaled}


def learner_totals(learner_dir, report="learner_steps.jsonl"):
    """Steps and groups the learner trained on, and the groups it acknowledged untrained
    (stale ones whose prompts it handed back, second groups of trained prompts), from its
    report file (learner.report_file, or an adapter's; every line counts its own step's)."""
    steps = groups = requeued = duplicates = 0
    path = os.path.join(learner_dir, report)
    for line in open(path) if os.path.exists(path) else []:
        r = json.loads(line)
        groups += r["groups"]
        steps += 1
        requeued += r["stale_requeued"]
        duplicates += r["duplicate_groups"]
    return steps, groups, requeued, duplicates


def drained_replay(learner, segment, groups_per_step):
    """The segment's counters once the learner has taken every group it will (fewer than a
    step's worth may stay, ready or leased to the learner waiting for the rest of its step),
    read as `kubectl exec` would: `prl replay stat`."""
    deadline, last = time.time() + 120, None
    while time.time() < deadline:
        stat = json.loads(exec_in(learner, "learner", ["replay", "stat", segment, "--json"]))
        left = stat["groups_leased"] + stat["groups_ready"]
        settled = (stat["groups_in"], stat["dropped_stale"], left)
        if left < groups_per_step and last is not None and settled == last[0]:
            return stat
        last = (settled, stat)
        time.sleep(3)
    raise RuntimeError("the learner did not drain the replay buffer: %s" % (last and last[1]))


def report_tenants(kube, fleet, result):
    """Each adapter's accounting: its set at the coordinator, its replay segment in the pod of
    the learner rank it is placed on (filled by that pod's replay ingest from the actor pods)
    drained by that rank, its steps from its report file; each rank pod's ingest; the actor pods
    and the prompts each leased (deploy/rehearsal/tenants.py)."""
    ranks = sorted((p for p in fleet.pods() if p.name.startswith("prl-learner-")),
                   key=lambda p: int(p.name.rsplit("-", 1)[1]))
    coordinator = next(p for p in fleet.pods() if p.name == "prl-coordinator-0")
    config_map = next(v["configMap"]["name"] for v in ranks[0].spec["volumes"] if v["name"] == "config")
    config = json.loads(fleet.index[("ConfigMap", config_map)]["data"]["run.json"])
    adapters = json.loads(client(kube, fleet, ["adapter", "list", "--server", "prl-coordinator:50051",
                                               "--json"]))
    stats, totals = {}, {}
    for a in adapters:
        segment = "prl-%s-replay-%s" % (config["run"]["name"], a["adapter_id"])
        pod = ranks[a.get("learner_rank", 0) % len(ranks)]
        stats[a["name"]] = drained_replay(pod, segment, config["learner"]["groups_per_step"])
        totals[a["name"]] = learner_totals(kube.pvc + "/prl-learner-checkpoints",
                                           "learner_steps.%s.jsonl" % a["name"])
    actors = {p.name: p.ip for p in fleet.pods() if p.name in fleet.by_owner.get("prl-actor", [])}
    tenants.report(result, adapters, stats, totals, tenants.metrics_of(coordinator),
                   [tenants.metrics_of(p) for p in ranks],
                   [tenants.metrics_of(p, tenants.INGEST_METRICS_PORT) for p in ranks], actors, ranks)


def report(kube, fleet, prometheus, scenario, start):
    learner = next(p for p in fleet.pods() if p.name == "prl-learner-0")
    coordinator = next(p for p in fleet.pods() if p.name == "prl-coordinator-0")
    config_map = next(v["configMap"]["name"] for v in learner.spec["volumes"] if v["name"] == "config")
    config = json.loads(fleet.index[("ConfigMap", config_map)]["data"]["run.json"])
    stat = drained_replay(learner, "prl-%s-replay" % config["run"]["name"], config["learner"]["groups_per_step"])
    steps, trained, handed_back, duplicates = learner_totals(kube.pvc + "/prl-learner-checkpoints")
    cm = observe.scrape(coordinator.ip, 9400)
    s = scenario["status"]
    written, dropped = stat["groups_in"], stat["dropped_stale"]
    left = stat["groups_ready"] + stat["groups_leased"]
    leased = {k.split('"')[1]: v for k, v in cm.items() if k.startswith("prl_prompts_leased_total{")}
    print("\n== accounting")
    print("prompts submitted:              %d (set %s, %d samples each)" % (PROMPTS, scenario["set"], SAMPLES))
    print("coordinator: done %d/%d, in flight %d, pending %d; leases expired %d, lease requests throttled %d" % (
        s["prompts_done"], s["prompts_total"], s["prompts_in_flight"], s["prompts_pending"],
        cm.get("prl_prompt_leases_expired_total", 0), cm.get("prl_lease_requests_throttled_total", 0)))
    for actor, n in sorted(leased.items()):
        print("  prompts leased to %-34s %5d" % (actor, n))
    print("groups written to replay:       %d (%d beyond one per prompt: re-runs of expired leases)" % (written, written - PROMPTS))
    print("  trained by the learner:       %d in %d steps" % (trained, steps))
    print("  dropped as stale (> max_lag): %d" % dropped)
    print("  stale, handed back to the coordinator to run again: %d" % handed_back)
    print("  second groups of trained prompts, not trained: %d" % duplicates)
    print("  left in the buffer:           %d (less than one step of %d groups)" % (left, config["learner"]["groups_per_step"]))
    for t, done, replicas, actors in scenario["scaled"]:
        print("actors scaled to %d at %.0f s (%d prompts done)" % (replicas, t, done))
    print("prompt set done %.0f s after submit; rehearsal %.0f s so far" % (scenario["done_at"] - scenario["submitted"], time.time() - start))
    problems = []
    if s["state"] != "done" or s["prompts_done"] != PROMPTS or s["prompts_total"] != PROMPTS:
        problems.append("the coordinator did not complete every prompt: %s" % s)
    if written < PROMPTS or trained + dropped + handed_back + duplicates + left != written:
        problems.append("replay: %d written but %d trained + %d dropped + %d handed back + %d duplicates + %d left" % (
            written, trained, dropped, handed_back, duplicates, left))
    if [r for _, _, r, _ in scenario["scaled"]] != [3, 1]:
        problems.append("the actors were not scaled 1 -> 3 -> 1 during the run")
    print("\n== targets (Prometheus)")
    for pod, container, health in sorted(prometheus.up_targets()):
        print("  %-40s %-12s %s" % (pod, container, health))
    print("\n== queries at the end of the run")
    queries = json.loads(subprocess.run(["/usr/bin/python3", os.path.join(REPO, "deploy/validate/monitoring.py"), "queries"],
                                        check=True, capture_output=True, text=True).stdout)
    lines, failures = observe.check_queries(prometheus, queries, scenario["done_at"])
    print("\n".join(lines))
    if failures:
        problems.append("%d queries returned no data" % failures)
    print("\nrehearsal: %d queries, %d without data; %s" % (len(queries), failures, "; ".join(problems) or "every prompt accounted for"))
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["--tenants"]):
        sys.exit(__doc__)
    prl, run_id = os.path.abspath(sys.argv[1]), sys.argv[2]
    with_tenants = sys.argv[3:] == ["--tenants"]
    work = tempfile.mkdtemp(prefix="prl-rehearsal-%s-" % run_id)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("rehearsal: terminated"))  # clean up too
    print("rehearsal %s in %s" % (run_id, work), flush=True)
    ok = False
    try:
        run(prl, run_id, work, with_tenants)
        ok = True
    finally:
        network.remove_leftovers(run_id)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("rehearsal failed; logs kept in %s/pods" % work, flush=True)
