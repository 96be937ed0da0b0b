#!/usr/bin/env bash
# Offline validation of deploy/ (ctest deploy.k8s and deploy.monitoring; docs/deploy.md):
#
#   validate.sh k8s PATH_TO_PRL   renders base, every overlay and the components on them with
#                                 `kubectl kustomize`; every object validates against the
#                                 Kubernetes schemas (kubernetes-models, offline), passes
#                                 check_manifests.py, and every run config parses strictly
#                                 (prl ROLE --config F --print-config)
#   validate.sh monitoring        promtool check rules / test rules / check config (Kubernetes
#                                 discovery swapped for file discovery: Debian's Prometheus is
#                                 built without it), the PodMonitor's schema, the dashboard's and
#                                 alerts' metric names against the catalog, the Dockerfiles' lists
#
# Needs kubectl with kustomize 5 (not a Debian package: this machine has one) and the npm
# packages of deploy/validate (scripts/setup_deploy_validation.sh installs them).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
k8s=$here/../k8s
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -d $here/node_modules/kubernetes-models ]]; then
  echo "validate: kubernetes-models is missing; run scripts/setup_deploy_validation.sh" >&2
  exit 1
fi

to_json() { /usr/bin/python3 -c 'import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))'; }

# render NAME RESOURCE [COMPONENT...]: a kustomization in $work/NAME over them, rendered.
render() {
  local name=$1 resource=$2
  shift 2
  mkdir -p "$work/$name"
  {
    echo "resources: [$(realpath --relative-to="$work/$name" "$k8s/$resource")]"
    if [[ $# -gt 0 ]]; then
      echo "components:"
      for c in "$@"; do echo "  - $(realpath --relative-to="$work/$name" "$k8s/components/$c")"; done
    fi
  } > "$work/$name/kustomization.yaml"
  kubectl kustomize "$work/$name" > "$work/$name.yaml"
}

validate_k8s() {
  local prl=$1 failures=0
  command -v kubectl >/dev/null || { echo "validate: kubectl not found" >&2; exit 1; }
  render base base
  render cpu-dev overlays/cpu-dev
  render gpu overlays/gpu
  render cpu-dev-colocated overlays/cpu-dev colocated
  render gpu-colocated overlays/gpu colocated
  render cpu-dev-secure overlays/cpu-dev security
  render gpu-secure-colocated overlays/gpu security colocated
  for name in base cpu-dev gpu cpu-dev-colocated gpu-colocated cpu-dev-secure gpu-secure-colocated; do
    echo "== $name"
    to_json < "$work/$name.yaml" > "$work/$name.json"
    if ! (cd "$here" && node validate-objects.mjs < "$work/$name.json" > "$work/$name.schema"); then
      grep FAIL "$work/$name.schema" >&2
      failures=$((failures + 1))
    fi
    tail -1 "$work/$name.schema"
    /usr/bin/python3 "$here/check_manifests.py" "$name" < "$work/$name.json" || failures=$((failures + 1))
  done
  # The security component wires every role's TLS and tokens.
  local args
  args=$(grep -c -- '- security\.' "$work/cpu-dev-secure.yaml")
  if [[ $args -ne 23 ]]; then
    echo "FAIL cpu-dev-secure: $args security settings, expected 23 (coordinator 7, learner 6," \
      "replay ingest 5, actor 5: components/security)" >&2
    failures=$((failures + 1))
  fi
  # Every run config the fleet can mount parses strictly (unknown keys are errors).
  for config in "$k8s"/base/run.json "$k8s"/overlays/*/run.json; do
    for role in coordinator "learner serve" actor "replay serve"; do
      # shellcheck disable=SC2086
      if ! "$prl" $role --config "$config" --print-config > /dev/null; then
        echo "FAIL: prl $role rejects $config" >&2
        failures=$((failures + 1))
      fi
    done
    echo "ok   $config parses for every role"
  done
  echo "k8s: $failures failure(s)"
  [[ $failures -eq 0 ]]
}

validate_monitoring() {
  local mon=$here/../monitoring failures=0
  promtool check rules "$mon/prl-alerts.yaml" || failures=$((failures + 1))
  (cd "$mon" && promtool test rules prl-alerts.test.yaml) || failures=$((failures + 1))
  /usr/bin/python3 "$here/monitoring.py" sd-config "$work/prometheus.yaml" "$work/targets.json"
  cp "$mon/prl-alerts.yaml" "$work/"
  echo '[]' > "$work/targets.json"
  promtool check config "$work/prometheus.yaml" || failures=$((failures + 1))
  kubectl kustomize "$mon" > "$work/monitoring.yaml" || failures=$((failures + 1))
  to_json < "$mon/podmonitor.yaml" > "$work/podmonitor.json"
  (cd "$here" && node validate-objects.mjs < "$work/podmonitor.json") || failures=$((failures + 1))
  /usr/bin/python3 "$here/monitoring.py" check-names || failures=$((failures + 1))
  # The images install the shared package lists, the same ones scripts/setup.sh installs.
  for dockerfile in "$here"/../docker/Dockerfile "$here"/../docker/Dockerfile.cuda; do
    if grep -q 'packages/build.txt | xargs apt-get install' "$dockerfile" &&
       grep -q 'runtime.txt | xargs apt-get install' "$dockerfile"; then
      echo "ok   $(basename "$dockerfile") installs scripts/packages/build.txt and runtime.txt"
    else
      echo "FAIL $(basename "$dockerfile") does not install the shared package lists" >&2
      failures=$((failures + 1))
    fi
  done
  echo "monitoring: $failures failure(s)"
  [[ $failures -eq 0 ]]
}

case ${1:-} in
  k8s) validate_k8s "${2:?usage: $0 k8s PATH_TO_PRL}" ;;
  monitoring) validate_monitoring ;;
  *) echo "usage: $0 k8s PATH_TO_PRL | monitoring" >&2; exit 2 ;;
esac
