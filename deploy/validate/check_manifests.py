#!/usr/bin/python3
"""Checks a rendered prl fleet (JSON array of Kubernetes objects on stdin) for what the schemas
cannot see: the learner's WORLD_SIZE and the coordinator's LEARNER_WORLD_SIZE equal the learner's
replica count and RANK comes from the pod index;
every pod runs as non-root with a token-less ServiceAccount; every container is read-only,
without privilege escalation or capabilities, with requests and limits; every prl role container
has a liveness probe on /healthz and (but for the replay ingest) a readiness probe on /readyz;
every workload is selected by a NetworkPolicy of its own; Service ports name their target ports.

With --prl, the security of every prl role container, from the config it runs with (its
command line with `--print-config`, the run config of its ConfigMap):
  - no gRPC listener on a non-loopback address without TLS or an explicit security.insecure
    (prl refuses to start: docs/configuration.md, security.*);
  - --security mtls (the default overlays): every role has its certificate, key and CA, demands
    client certificates, is not insecure, and has exactly the token files its role reads
    (roles/role_security.cc: the coordinator client, actor and learner; the learner and the
    replay ingest actor and learner; an actor its own), each a key of a required Secret the
    container mounts at that path;
  - --security insecure (components/insecure): every listener says security.insecure, nothing
    of TLS or tokens;
  - --secrets DIR (make-secrets.sh's output): every server name a container dials (the
    coordinator, replay and weight Services, MASTER_ADDR) is in the certificate of the pod the
    name reaches, as gRPC matches names (a wildcard covers one label of three or more);
  - every role container agrees on the run of adapters (components/tenants): all or none has
    coordinator.adapters, and those that have it the same learner.lora_rank, lora_alpha and
    lora_targets (each new adapter's defaults; every role reads the same rules).
--security none (the base, not deployed alone) checks none of these.

usage: check_manifests.py NAME [--prl PRL] [--security mtls|insecure|none] [--secrets DIR]
         < objects.json     (NAME labels the output)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("name")
parser.add_argument("--prl")
parser.add_argument("--security", choices=["mtls", "insecure", "none"], default="none")
parser.add_argument("--secrets")
options = parser.parse_args()
name = options.name
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
        # The coordinator places a run of adapters' adapters on the learner's ranks.
        for o in workloads:
            if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") != "coordinator":
                continue
            c = next(c for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == "coordinator")
            ranks = {e["name"]: e.get("value") for e in c.get("env", [])}.get("LEARNER_WORLD_SIZE")
            check(ranks == str(w["spec"]["replicas"]) and "learner.world_size=$(LEARNER_WORLD_SIZE)" in c["args"],
                  "the coordinator's learner.world_size (LEARNER_WORLD_SIZE %s) is not %s's %s replicas" % (
                      ranks, wname, w["spec"]["replicas"]))
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


# The token files each role reads (roles/role_security.cc: the role it calls as and the roles it
# admits), the gRPC listeners it serves and the servers it dials.
# The learner ranks whose servers an address naming {rank} reaches: the learner's replicas, and at
# least two (validate.sh's make-secrets.sh names two ranks' pods).
LEARNER_RANKS = max([2] + [w["spec"].get("replicas", 1) for w in workloads
                           if w["metadata"]["name"] == "prl-learner"])
TOKENS = {"coordinator": {"client", "actor", "learner"}, "learner serve": {"actor", "learner"},
          "replay serve": {"actor", "learner"}, "actor": {"actor"}}
# The keys of the Secrets make-secrets.sh writes (a volume without items mounts them all).
SECRET_KEYS = {"prl-tokens": {"client", "actor", "learner"}}
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}


def role_of(c):
    args = c.get("args", [])
    for role in TOKENS:
        if args[:len(role.split())] == role.split():
            return role
    return None


def expand_env(c, objects_by_key):
    """The container's environment with placeholders where only a running pod knows the value."""
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            env[e["name"]] = objects_by_key[("ConfigMap", ref["name"])]["data"][ref["key"]]
        elif "fieldRef" in src and src["fieldRef"]["fieldPath"] == "metadata.name":
            env[e["name"]] = "pod"
        else:
            env[e["name"]] = "0" if "pod-index" in str(src) else "1"
    return env


def effective_config(pod, c, env, objects_by_key, work):
    """`prl ROLE ARGS --print-config` with the run config of the pod's config volume."""
    volume = next(v for v in pod.get("volumes", []) if v["name"] == "config")
    run_json = objects_by_key[("ConfigMap", volume["configMap"]["name"])]["data"]["run.json"]
    path = os.path.join(work, "run.json")
    with open(path, "w") as f:
        f.write(run_json)
    args = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in c["args"]]
    args = [path if a == "/etc/prl/config/run.json" else a for a in args]
    out = subprocess.run([options.prl] + args + ["--print-config"], capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return json.loads(out.stdout), None


def loopback(address):
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def secret_file(pod, c, path):
    """The (Secret name, key, optional) a file path of the container comes from, or None."""
    for m in c.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(root):
            continue
        volume = next(v for v in pod.get("volumes", []) if v["name"] == m["name"])
        secret = volume.get("secret")
        if secret is None:
            return None
        rel = path[len(root):]
        items = secret.get("items")
        keys = ({i["path"]: i["key"] for i in items} if items else
                {k: k for k in SECRET_KEYS.get(secret["secretName"], TLS_KEYS)})
        return (secret["secretName"], keys[rel], secret.get("optional", False)) if rel in keys else None
    return None


def sans(cert):
    out = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout
    return re.findall(r"DNS:([^,\s]+)", out)


def grpc_matches(host, entries):
    """gRPC's name check (tsi_ssl_peer_matches_name): an exact name, or "*.REST" for a host of
    one more label whose REST has a dot of its own."""
    for entry in entries:
        if entry.lower() == host.lower():
            return True
        if entry.startswith("*.") and "." in host:
            rest = host.split(".", 1)[1]
            if "." in rest.rstrip(".") and rest.lower() == entry[2:].lower():
                return True
    return False


def reached_workload(host, services, workloads):
    """The workload whose pods a Service name (or a headless Service's pod name) reaches."""
    labels = host.split(".")
    candidates = [(labels[0], None)] + ([(labels[1], labels[0])] if len(labels) > 1 else [])
    for service_name, pod_name in candidates:
        s = services.get(service_name)
        if s is None or (pod_name is not None and s["spec"].get("clusterIP") != "None"):
            continue
        selector = s["spec"].get("selector", {})
        for w in workloads:
            tl = w["spec"]["template"]["metadata"]["labels"]
            if all(tl.get(k) == v for k, v in selector.items()
                   if k != "statefulset.kubernetes.io/pod-name"):
                return w
    return None


if options.prl and options.security != "none":
    objects_by_key = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    work = tempfile.mkdtemp()  # the run config each command line reads; removed below
    checked = dialed = 0
    adapters = {}  # each role container's run of adapters, from its effective config
    for w in workloads:
        wname = "%s/%s" % (w["kind"], w["metadata"]["name"])
        pod = w["spec"]["template"]["spec"]
        for c in pod["containers"]:
            role = role_of(c) if c.get("command") == ["prl"] else None
            if role is None:
                continue
            cname = "%s container %s (%s)" % (wname, c["name"], role)
            env = expand_env(c, objects_by_key)
            config, error = effective_config(pod, c, env, objects_by_key, work)
            if config is None:
                check(False, cname + ": its command line does not parse: " + error)
                continue
            checked += 1
            learner = config["learner"]
            adapters[cname] = ((True, learner["lora_rank"], learner["lora_alpha"],
                                learner["lora_targets"]) if config["coordinator"]["adapters"]
                               else (False,))
            sec = config["security"]
            tls = bool(sec["tls_cert_file"] and sec["tls_key_file"])
            listeners = {"coordinator": [config["coordinator"]["listen"]],
                         "replay serve": [config["replay"]["listen"]], "actor": []}.get(role, [])
            dials = {"coordinator": []}.get(role, [config["coordinator"]["address"]])
            if role == "learner serve":
                if config["broadcast"]["transport"] in ("grpc", "nccl"):
                    listeners.append(config["broadcast"]["listen"])
                if not loopback(env.get("MASTER_ADDR", "localhost") + ":0"):
                    listeners.append("0.0.0.0:%s" % env.get("MASTER_PORT"))  # collective/kv_store.cc
                    dials.append("%s:%s" % (env["MASTER_ADDR"], env.get("MASTER_PORT")))
            if role == "actor":
                dials.append(config["replay"]["address"])
                if config["broadcast"]["transport"] in ("grpc", "nccl"):
                    dials.append(config["broadcast"]["address"])
            for address in listeners:
                check(loopback(address) or tls or sec["insecure"],
                      cname + ": listens on %s (not loopback) without TLS or security.insecure: "
                      "prl refuses to start" % address)
            tokens = {r for r in ("client", "actor", "learner") if sec[r + "_token_file"]}
            if options.security == "mtls":
                check(tls and sec["tls_ca_file"] and sec["require_client_cert"] and not sec["insecure"],
                      cname + ": not mutual TLS (certificate, key, CA, require_client_cert)")
                check(tokens == TOKENS[role], cname + ": token files of %s, expected %s" % (
                    sorted(tokens), sorted(TOKENS[role])))
                files = [sec[k] for k in ("tls_cert_file", "tls_key_file", "tls_ca_file")]
                files += [sec[r + "_token_file"] for r in sorted(tokens)]
                for f in (f for f in files if f):
                    origin = secret_file(pod, c, f)
                    check(origin is not None and not origin[2],
                          cname + ": %s is not a key of a required Secret it mounts" % f)
                    if origin and origin[0] == "prl-tokens":
                        check(origin[1] == os.path.basename(f) and origin[1] in tokens,
                              cname + ": %s holds the %s token" % (f, origin[1]))
            elif options.security == "insecure":
                check(sec["insecure"] or not listeners, cname + ": serves without security.insecure")
                check(not (sec["tls_cert_file"] or sec["tls_ca_file"] or tokens),
                      cname + ": TLS or token settings with components/insecure")
            # {rank} (a run of adapters): each learner rank's server, as many as the certificates name.
            dials = [a.replace("{rank}", str(r)) if "{rank}" in a else a
                     for a in dials for r in (range(LEARNER_RANKS) if "{rank}" in a else [0])]
            if options.secrets and options.security == "mtls":
                for address in (a for a in dials if a):
                    host = address.rsplit(":", 1)[0]
                    target = reached_workload(host, services, workloads)
                    if target is None:
                        check(False, cname + ": dials %s, which no Service of the fleet names" % host)
                        continue
                    volume = next(v for v in target["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
                    cert = os.path.join(options.secrets, volume["secret"]["secretName"][len("prl-tls-"):] + ".crt")
                    check(grpc_matches(host, sans(cert)),
                          cname + ": dials %s, not a name of %s's certificate (make-secrets.sh)" % (host, target["metadata"]["name"]))
                    dialed += 1
    check(len(set(adapters.values())) <= 1,
          "the role containers disagree on the run of adapters (coordinator.adapters, "
          "learner.lora_rank, lora_alpha, lora_targets): %s" % "; ".join(
              "%s %s" % (c, a) for c, a in sorted(adapters.items())))
    shutil.rmtree(work, ignore_errors=True)
    print("%s: security of %d role containers checked (%s)%s" % (
        name, checked, options.security,
        ", %d dialed names in the certificates" % dialed if options.secrets and options.security == "mtls" else ""))

for p in problems:
    print("FAIL %s: %s" % (name, p))
print("%s: %d workloads, %d NetworkPolicies, %d problem(s)" % (name, len(workloads), len(policies), len(problems)))
sys.exit(1 if problems else 0)
