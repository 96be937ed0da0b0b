#!/usr/bin/python3
"""deploy/monitoring as code checks it: the queries of the Grafana dashboard and of the alert
rules, and the metric names they use, which must all be in prl's catalog (metrics/prl_metrics.cc)
or Prometheus's own `up`.

  monitoring.py check-names          every metric a query names is in the catalog
  monitoring.py queries              the queries as JSON [{"source", "expr"}], Grafana's
                                     $__rate_interval and $namespace filled in (the rehearsal
                                     runs them against a real Prometheus)
  monitoring.py sd-config OUT FILE   prometheus.yaml with each kubernetes_sd_configs replaced by
                                     a file_sd_configs reading FILE (Debian's Prometheus is
                                     built without Kubernetes discovery), after checking the
                                     discovery block's shape; everything else unchanged
"""
import json
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MONITORING = os.path.join(ROOT, "deploy", "monitoring")


def catalog():
    """Series names the catalog exports: each family, and a histogram's _bucket/_sum/_count."""
    text = open(os.path.join(ROOT, "metrics", "prl_metrics.cc")).read()
    names = set()
    for call, name in re.findall(r'(AddHistogram|AddGauge|AddCounter|CounterFamily|GaugeFamily|DroppedGroups)'
                                 r'\(\s*(?:registry,\s*)?"(prl_\w+)"', text):
        names.add(name)
        if call == "AddHistogram":
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
    # DroppedGroups registers prl_replay_groups_dropped_total inside its body.
    names.update(re.findall(r'"(prl_\w+_total)"', text))
    return names


def queries():
    out = []
    dashboard = json.load(open(os.path.join(MONITORING, "grafana", "prl-dashboard.json")))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace('"$namespace"', '".*"')
            out.append({"source": "dashboard: %s (%s)" % (panel["title"], target.get("legendFormat", "")),
                        "expr": expr})
    rules = yaml.safe_load(open(os.path.join(MONITORING, "prl-alerts.yaml")))
    for group in rules["groups"]:
        for rule in group["rules"]:
            out.append({"source": "alert: " + rule["alert"], "expr": " ".join(rule["expr"].split())})
    return out


def metric_names(expr):
    """The metric names an expression selects: prl_* names and `up`."""
    return set(re.findall(r"\b(prl_\w+)", expr)) | ({"up"} if re.search(r"\bup\{", expr) else set())


def check_names():
    known = catalog()
    problems = 0
    used = set()
    for q in queries():
        for name in metric_names(q["expr"]) - {"up"}:
            used.add(name)
            if name not in known:
                print("FAIL %s: %s is not in metrics/prl_metrics.cc" % (q["source"], name))
                problems += 1
    print("%d queries use %d catalog series (of %d); %d unknown" %
          (len(queries()), len(used), len(known), problems))
    return problems == 0


def sd_config(out_path, targets_file):
    config = yaml.safe_load(open(os.path.join(MONITORING, "prometheus.yaml")))
    for job in config["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs")
        assert len(sd) == 1 and sd[0]["role"] == "pod" and sd[0]["namespaces"]["names"], sd
        assert set(sd[0]) <= {"role", "namespaces", "selectors", "api_server"}, sd
        job["file_sd_configs"] = [{"files": [targets_file], "refresh_interval": "5s"}]
    yaml.safe_dump(config, open(out_path, "w"), sort_keys=False)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "check-names":
        sys.exit(0 if check_names() else 1)
    elif command == "queries":
        print(json.dumps(queries(), indent=1))
    elif command == "sd-config" and len(sys.argv) == 4:
        sd_config(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
