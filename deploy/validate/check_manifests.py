#!/usr/bin/python3
"""Checks a rendered prl fleet (JSON array of Kubernetes objects on stdin) for what the schemas
cannot see: the learner's WORLD_SIZE equals its replica count and RANK comes from the pod index;
every pod runs as non-root with a token-less ServiceAccount; every container is read-only,
without privilege escalation or capabilities, with requests and limits; every prl role container
has a liveness probe on /healthz and (but for the replay ingest) a readiness probe on /readyz;
every workload is selected by a NetworkPolicy of its own; Service ports name their target ports.

usage: check_manifests.py NAME < objects.json     (NAME labels the output)
"""
import json
import sys

name = sys.argv[1]
objects = json.load(sys.stdin)
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


def containers(pod):
    return pod.get("initContainers", []) + pod["containers"]


workloads = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]
policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
check(workloads, "no workloads rendered")
for w in workloads:
    wname = "%s/%s" % (w["kind"], w["metadata"]["name"])
    pod = w["spec"]["template"]["spec"]
    labels = w["spec"]["template"]["metadata"]["labels"]
    check(pod.get("automountServiceAccountToken") is False, wname + ": mounts a service account token")
    check(pod.get("serviceAccountName") == "prl", wname + ": not the prl ServiceAccount")
    sc = pod.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) > 0, wname + ": may run as root")
    check(pod.get("terminationGracePeriodSeconds", 0) >= 30, wname + ": no grace period to stop")
    for c in containers(pod):
        cname = "%s container %s" % (wname, c["name"])
        csc = c.get("securityContext", {})
        check(csc.get("readOnlyRootFilesystem") is True, cname + ": writable root filesystem")
        check(csc.get("allowPrivilegeEscalation") is False, cname + ": privilege escalation")
        check(csc.get("capabilities", {}).get("drop") == ["ALL"], cname + ": keeps capabilities")
        res = c.get("resources", {})
        check(res.get("requests") and res.get("limits"), cname + ": no requests or limits")
        if c in pod.get("initContainers", []) or c["command"] != ["prl"]:
            continue
        live = c.get("livenessProbe", {}).get("httpGet", {})
        check(live.get("path") == "/healthz", cname + ": no liveness probe on /healthz")
        ready = c.get("readinessProbe", {}).get("httpGet", {})
        if c["args"][:2] != ["replay", "serve"]:
            check(ready.get("path") == "/readyz", cname + ": no readiness probe on /readyz")
        ports = {p["name"] for p in c.get("ports", [])}
        for probe in (live, ready):
            if probe:
                check(probe.get("port") in ports, cname + ": probe port %s is not a named port" % probe.get("port"))
    if labels.get("app.kubernetes.io/component") == "learner":
        learner = next(c for c in pod["containers"] if c["name"] == "learner")
        env = {e["name"]: e for e in learner["env"]}
        check(env["WORLD_SIZE"].get("value") == str(w["spec"]["replicas"]),
              wname + ": WORLD_SIZE %s but %s replicas" % (env["WORLD_SIZE"].get("value"), w["spec"]["replicas"]))
        check(env["RANK"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
              "metadata.labels['apps.kubernetes.io/pod-index']", wname + ": RANK is not the pod index")
        check("learner.world_size=$(WORLD_SIZE)" in learner["args"], wname + ": learner.world_size not WORLD_SIZE")
        check(pod.get("shareProcessNamespace") is True, wname + ": replay locks need one pid namespace")
    own = [p for p in policies
           if all(labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())
           and p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
           == labels.get("app.kubernetes.io/component")]
    check(own, wname + ": no NetworkPolicy of its own")

pods = {w["metadata"]["name"]: w for w in workloads}
for s in (o for o in objects if o["kind"] == "Service"):
    for port in s["spec"]["ports"]:
        check(isinstance(port.get("targetPort"), str), "Service/%s: port %s targets no named port"
              % (s["metadata"]["name"], port.get("name")))

for p in problems:
    print("FAIL %s: %s" % (name, p))
print("%s: %d workloads, %d NetworkPolicies, %d problem(s)" % (name, len(workloads), len(policies), len(problems)))
sys.exit(1 if problems else 0)
