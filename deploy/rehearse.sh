#!/usr/bin/env bash
# The rehearsal of the cpu-dev fleet on this machine (ctest deploy.rehearsal; docs/deploy.md,
# "Rehearsal"): renders deploy/k8s/overlays/cpu-dev with kubectl kustomize, runs every
# container of it as a process in its pod's network, mount and UTS namespaces as a kubelet would
# (deploy/rehearsal/kubelet.py), submits a prompt set through the coordinator's Service name,
# scales the actors 1 -> 3 -> 1 mid-run, prints the accounting of every prompt, then checks
# that every dashboard and alert query returns data from a real Prometheus that scraped it.
# Cleans up its namespaces, processes and /dev/shm on every exit path.
#
#   deploy/rehearse.sh PATH_TO_PRL [--tenants]   (as root: namespaces and mounts)
#
# --tenants: the shared fleet of tenants' adapters instead (components/colocated and
# components/tenants on the overlay): two adapters' sets through the coordinator's Service, each
# adapter trained on its own groups by the learner beside the actors, every prompt accounted for.
set -euo pipefail

prl=${1:?usage: $0 PATH_TO_PRL [--tenants]}
shift
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(id -u) -ne 0 ]]; then
  echo "rehearse: needs root (ip netns, mount, chroot)" >&2
  exit 1
fi
for tool in kubectl prometheus ip nsenter unshare setpriv openssl /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "rehearse: $tool not found (scripts/setup.sh)" >&2; exit 1; }
done

run_id=$(( $$ % 90000 + 10000 ))
cleanup() {
  # What main.py's own clean-up could not reach if it was killed: its pods' processes and
  # namespaces (deploy/rehearsal/network.py remove_leftovers) and its /dev/shm directory.
  /usr/bin/python3 -c "import sys; sys.path.insert(0, '$here/rehearsal'); import network; network.remove_leftovers('$run_id')"
  rm -rf "/dev/shm/prl-rehearsal-$run_id"
}
trap cleanup EXIT
/usr/bin/python3 "$here/rehearsal/main.py" "$prl" "$run_id" "$@"
