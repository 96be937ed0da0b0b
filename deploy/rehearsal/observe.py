"""The rehearsal's monitoring: Debian's Prometheus with the rendered scrape config, in which
the one thing this machine cannot run, Kubernetes pod discovery, is replaced by file discovery
of the very targets it would find (one per container port of every running pod, with the
__meta_kubernetes_pod_* labels it would set), so that the config's relabelling runs unchanged;
then every query of the dashboard and of the alert rules against what it scraped.
"""
import json
import math
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request


def sanitize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def sd_targets(pods):
    """Kubernetes SD's pod-role targets of `pods` (kubelet.Pod objects)."""
    groups = []
    for pod in pods:
        meta = pod.obj["metadata"]
        base = {"__meta_kubernetes_namespace": meta["namespace"],
                "__meta_kubernetes_pod_name": meta["name"],
                "__meta_kubernetes_pod_ip": pod.ip,
                "__meta_kubernetes_pod_phase": pod.phase,
                "__meta_kubernetes_pod_ready": "true" if pod.ready() else "false",
                "__meta_kubernetes_pod_controller_name": meta["owner"]}
        for k, v in meta["labels"].items():
            base["__meta_kubernetes_pod_label_" + sanitize(k)] = v
            base["__meta_kubernetes_pod_labelpresent_" + sanitize(k)] = "true"
        for init, containers in ((True, pod.spec.get("initContainers", [])), (False, pod.spec["containers"])):
            for c in containers:
                labels = dict(base, __meta_kubernetes_pod_container_name=c["name"],
                              __meta_kubernetes_pod_container_init=str(init).lower())
                if not c.get("ports"):
                    groups.append({"targets": [pod.ip], "labels": labels})
                for port in c.get("ports", []):
                    groups.append({"targets": ["%s:%d" % (pod.ip, port["containerPort"])],
                                   "labels": dict(labels,
                                                  __meta_kubernetes_pod_container_port_name=port.get("name", ""),
                                                  __meta_kubernetes_pod_container_port_number=str(port["containerPort"]),
                                                  __meta_kubernetes_pod_container_port_protocol="TCP")})
    return groups


class Prometheus:
    def __init__(self, repo, work, port):
        self.dir = os.path.join(work, "prometheus")
        os.makedirs(self.dir, exist_ok=True)
        self.targets = os.path.join(self.dir, "targets.json")
        self.url = "http://127.0.0.1:%d" % port
        self.write_targets([])
        config = os.path.join(self.dir, "prometheus.yaml")
        subprocess.run(["/usr/bin/python3", os.path.join(repo, "deploy/validate/monitoring.py"), "sd-config",
                        config, self.targets], check=True)
        with open(os.path.join(repo, "deploy/monitoring/prl-alerts.yaml")) as src, \
                open(os.path.join(self.dir, "prl-alerts.yaml"), "w") as dst:
            dst.write(src.read())
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            ["prometheus", "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(100):
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not start: see " + self.log.name)

    def write_targets(self, groups):
        tmp = self.targets + ".tmp"
        with open(tmp, "w") as f:
            json.dump(groups, f)
        os.replace(tmp, self.targets)  # file discovery re-reads it atomically

    def query(self, expr, at):
        """(ok, series, finite values) of an instant query at unix time `at`; ok False on error."""
        url = "%s/api/v1/query?%s" % (self.url, urllib.parse.urlencode({"query": expr, "time": "%.3f" % at}))
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except OSError as e:
            return False, 0, 0, str(e)
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            result = [{"value": result}]
        finite = sum(1 for s in result if not math.isnan(float(s["value"][1])))
        return True, len(result), finite, ""

    def up_targets(self):
        with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=10) as r:
            active = json.load(r)["data"]["activeTargets"]
        return [(t["labels"].get("pod"), t["labels"].get("container"), t["health"]) for t in active]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def selectors(expr):
    """The vector selectors of an expression: prl_* names and `up`, with their matchers."""
    return [m.group(0) for m in re.finditer(r"\b(prl_\w+|up(?=\{))(\{[^}]*\})?", expr)]


def check_queries(prometheus, queries, at):
    """Every dashboard query returns finite data at `at`; every alert expression evaluates and
    every series it selects has data. Returns the report lines and the failures."""
    lines, failures = [], 0
    for q in queries:
        if q["source"].startswith("dashboard"):
            ok, series, finite, error = prometheus.query(q["expr"], at)
            # The rehearsal runs no agentic episodes, no agents and no run of adapters
            # (docs/environments.md, docs/agents.md, docs/tenants.md): queries of their metrics
            # only have to evaluate (promtool and check-names test them otherwise).
            episodes_only = all(re.match(r"prl_(episode|environment|agent|adapter|tenant)_", s)
                                for s in selectors(q["expr"]))
            good = ok and (finite > 0 or episodes_only)
            lines.append("%s %s: %d series, %d finite%s" % (
                "ok  " if good else "FAIL", q["source"], series, finite,
                " (episode, agent, adapter or tenant metrics: none in this run)"
                if episodes_only and not finite else ""))
        else:
            ok, series, _, error = prometheus.query(q["expr"], at)
            empty = [s for s in selectors(q["expr"]) if prometheus.query(s, at)[1] == 0]
            good = ok and not empty
            lines.append("%s %s: evaluates (%d firing now); %d selectors with data%s" % (
                "ok  " if good else "FAIL", q["source"], series, len(selectors(q["expr"])) - len(empty),
                "; no data: " + ", ".join(empty) if empty else ""))
        failures += 0 if good else 1
    return lines, failures


def scrape(ip, port):
    """{series: value} of a /metrics endpoint."""
    out = {}
    with urllib.request.urlopen("http://%s:%d/metrics" % (ip, port), timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                out[series] = float(value)
    return out
