#!/usr/bin/env bash
# Offline validation of deploy/ (ctest deploy.k8s and deploy.monitoring; docs/deploy.md):
#
#   validate.sh k8s PATH_TO_PRL   renders base, every overlay and the components on them with
#                                 `kubectl kustomize`; every object validates against the
#                                 Kubernetes schemas (kubernetes-models, offline), passes
#                                 check_manifests.py (with the security of every role container:
#                                 mutual TLS and its tokens in the overlays, security.insecure
#                                 with components/insecure, the certificates of make-secrets.sh
#                                 naming every server a container dials; with components/tenants
#                                 the same run of adapters in every role container), and every
#                                 run config parses strictly (prl ROLE --config F --print-config)
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

# render NAME RESOURCE [COMPONENT...]: a kustomization in $work/NAME over them (RESOURCE and
# the components under $root: deploy/k8s, or the copy whose overlays opt out), rendered.
root=$k8s
render() {
  local name=$1 resource=$2
  shift 2
  mkdir -p "$work/$name"
  {
    echo "resources: [$(realpath --relative-to="$work/$name" "$root/$resource")]"
    if [[ $# -gt 0 ]]; then
      echo "components:"
      for c in "$@"; do echo "  - $(realpath --relative-to="$work/$name" "$root/components/$c")"; done
    fi
    if [[ -n ${learner_ranks:-} ]]; then
      # Your overlay's learner ranks: the replica count, and WORLD_SIZE and the coordinator's
      # LEARNER_WORLD_SIZE after it (as the overlays' replacements keep them).
      echo "replicas: [{name: prl-learner, count: $learner_ranks}]"
      echo "replacements:"
      echo "  - source: {kind: StatefulSet, name: prl-learner, fieldPath: spec.replicas}"
      echo "    targets:"
      echo "      - select: {kind: StatefulSet, name: prl-learner}"
      echo "        fieldPaths:"
      echo "          - spec.template.spec.containers.[name=learner].env.[name=WORLD_SIZE].value"
      echo "      - select: {kind: StatefulSet, name: prl-coordinator}"
      echo "        fieldPaths:"
      echo "          - spec.template.spec.containers.[name=coordinator].env.[name=LEARNER_WORLD_SIZE].value"
    fi
  } > "$work/$name/kustomization.yaml"
  kubectl kustomize "$work/$name" > "$work/$name.yaml"
}

# expect_settings NAME COUNT WHAT: the render carries COUNT `security.*` settings.
expect_settings() {
  local args
  args=$(grep -c -- '- security\.' "$work/$1.yaml" || true)
  if [[ $args -ne $2 ]]; then
    echo "FAIL $1: $args security settings, expected $2 ($3)" >&2
    failures=$((failures + 1))
  else
    echo "ok   $1: $2 security settings ($3)"
  fi
}

# expect_adapters NAME COUNT WHAT: COUNT containers of the render run a run of adapters
# (components/tenants): coordinator.adapters=true and the three learner.lora_* settings, COUNT
# of each.
expect_adapters() {
  local key n wrong=""
  for key in coordinator.adapters=true learner.lora_{rank,alpha,targets}=; do
    n=$(grep -cF -- "- $key" "$work/$1.yaml" || true)
    [[ $n -eq $2 ]] || wrong+=" $key x$n"
  done
  if [[ -n $wrong ]]; then
    echo "FAIL $1:$wrong, expected $2 of each ($3)" >&2
    failures=$((failures + 1))
  else
    echo "ok   $1: $2 containers run a run of adapters ($3)"
  fi
}

validate_k8s() {
  local prl=$1 failures=0 name mode
  command -v kubectl >/dev/null || { echo "validate: kubectl not found" >&2; exit 1; }
  # The certificates the dialed names are checked against (make-secrets.sh prints only paths).
  bash "$k8s/make-secrets.sh" "$work/secrets" prl 2 > /dev/null
  render base base
  render cpu-dev overlays/cpu-dev
  render gpu overlays/gpu
  render cpu-dev-colocated overlays/cpu-dev colocated
  render gpu-colocated overlays/gpu colocated
  # The other order (colocated first, as an overlay of your own may list them).
  render base-colocated-security base colocated security
  # A shared fleet of tenants' adapters (components/tenants): actors in their own pods, before
  # components/security too (either order), and after components/colocated.
  render cpu-dev-tenants overlays/cpu-dev tenants
  render base-tenants-security base tenants security
  render cpu-dev-colocated-tenants overlays/cpu-dev colocated tenants
  render base-colocated-security-tenants base colocated security tenants
  # Two learner ranks, each training the adapters placed on it; actors dial each rank's pod.
  learner_ranks=2 render cpu-dev-tenants-2-ranks overlays/cpu-dev tenants
  # Listed before components/colocated, its settings would miss the colocated actors:
  # components/colocated refuses to render.
  if render tenants-before-colocated overlays/cpu-dev tenants colocated 2> /dev/null; then
    echo "FAIL tenants-before-colocated: rendered; components/colocated should refuse" >&2
    failures=$((failures + 1))
  else
    echo "ok   tenants-before-colocated: refused (components/tenants goes after colocated)"
  fi
  # The opt-out: an overlay with components/insecure in place of components/security.
  cp -r "$k8s" "$work/k8s-insecure"
  sed -i 's|../../components/security|../../components/insecure|' "$work"/k8s-insecure/overlays/*/kustomization.yaml
  root=$work/k8s-insecure
  render cpu-dev-insecure overlays/cpu-dev
  render gpu-insecure-colocated overlays/gpu colocated
  root=$k8s
  for name in base cpu-dev gpu cpu-dev-colocated gpu-colocated base-colocated-security \
      cpu-dev-tenants base-tenants-security cpu-dev-colocated-tenants \
      base-colocated-security-tenants cpu-dev-tenants-2-ranks cpu-dev-insecure \
      gpu-insecure-colocated; do
    echo "== $name"
    case $name in
      base) mode=none ;;
      *-insecure*) mode=insecure ;;
      *) mode=mtls ;;
    esac
    to_json < "$work/$name.yaml" > "$work/$name.json"
    if ! (cd "$here" && node validate-objects.mjs < "$work/$name.json" > "$work/$name.schema"); then
      grep FAIL "$work/$name.schema" >&2
      failures=$((failures + 1))
    fi
    tail -1 "$work/$name.schema"
    /usr/bin/python3 "$here/check_manifests.py" "$name" --prl "$prl" --security "$mode" \
      --secrets "$work/secrets" < "$work/$name.json" || failures=$((failures + 1))
  done
  # components/security wires every role's TLS and tokens, in both overlays (coordinator 7:
  # TLS 4 and three tokens; learner 6 and replay ingest 6: TLS 4, actor and learner tokens;
  # actor 5: TLS 4 and its token); components/insecure sets security.insecure on the three
  # containers that listen.
  expect_settings cpu-dev 24 "coordinator 7, learner 6, replay ingest 6, actor 5"
  expect_settings gpu 24 "coordinator 7, learner 6, replay ingest 6, actor 5"
  expect_settings cpu-dev-colocated 29 "coordinator 7, learner 6, replay ingest 6, two actors 5"
  expect_settings base-colocated-security 29 "coordinator 7, learner 6, replay ingest 6, two actors 5"
  expect_settings cpu-dev-tenants 24 "coordinator 7, learner 6, replay ingest 6, actor 5"
  expect_settings base-tenants-security 24 "coordinator 7, learner 6, replay ingest 6, actor 5"
  expect_settings cpu-dev-colocated-tenants 29 \
    "coordinator 7, learner 6, replay ingest 6, two actors 5"
  expect_settings base-colocated-security-tenants 29 \
    "coordinator 7, learner 6, replay ingest 6, two actors 5"
  expect_settings cpu-dev-insecure 3 "security.insecure: coordinator, learner, replay ingest"
  expect_settings gpu-insecure-colocated 3 "security.insecure: coordinator, learner, replay ingest"
  # components/tenants sets the run of adapters on every role container.
  expect_adapters cpu-dev-tenants 4 "coordinator, learner, replay ingest, actor"
  expect_adapters cpu-dev-tenants-2-ranks 4 "coordinator, learner, replay ingest, actor"
  expect_adapters base-tenants-security 4 "coordinator, learner, replay ingest, actor"
  expect_adapters cpu-dev-colocated-tenants 5 "coordinator, learner, replay ingest, two actors"
  expect_adapters base-colocated-security-tenants 5 \
    "coordinator, learner, replay ingest, two actors"
  expect_adapters cpu-dev-colocated 0 "no run of adapters without components/tenants"
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
