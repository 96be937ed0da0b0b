#!/usr/bin/env bash
# Makes the TLS material and role tokens the fleet needs (components/security, in both overlays;
# docs/deploy.md, "Security"), for trying prl out (cert-manager users issue the certificates
# from their own CA instead, with the same DNS names): a private CA, one certificate per role
# (server and client authentication: mutual TLS) whose SANs are every name a peer dials it by,
# a client certificate for prl submit/status, and one bearer token per role. Writes the files to
# OUT_DIR (owner-only) and OUT_DIR/secrets.yaml with the Secrets the manifests mount
# (prl-tls-<role>, prl-tokens); prints nothing but paths, never a token or a key.
#
#   deploy/k8s/make-secrets.sh OUT_DIR [NAMESPACE [LEARNER_RANKS]]
#   kubectl apply -n NAMESPACE -f OUT_DIR/secrets.yaml
#
# NAMESPACE defaults to prl. LEARNER_RANKS (default 8) bounds the per-pod names of the learner
# (prl-learner-<i>.prl-learner...) named in its certificate: gRPC does not match a wildcard
# against the two-label short form, so those are listed one by one (the qualified forms are
# covered by wildcards too).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 3 ]]; then
  echo "usage: $0 OUT_DIR [NAMESPACE [LEARNER_RANKS]]" >&2
  exit 2
fi
out=$1
ns=${2:-prl}
ranks=${3:-8}
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
  echo "make-secrets: LEARNER_RANKS must be a positive number, not '$ranks'" >&2
  exit 2
fi
umask 077
mkdir -p "$out"
cd "$out"

# The names each role's certificate answers to: the names given, short and qualified (the
# forms cluster DNS resolves from inside NAMESPACE and from elsewhere).
sans() {
  local names=() n
  for n in "$@"; do
    names+=("DNS:$n" "DNS:$n.$ns" "DNS:$n.$ns.svc" "DNS:$n.$ns.svc.cluster.local")
  done
  local IFS=,
  echo "${names[*]}"
}

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -subj "/CN=prl-ca-$ns" -keyout ca.key -out ca.crt 2>/dev/null

# cert NAME SUBJECT_ALT_NAMES: NAME.key and NAME.crt signed by the CA, for server and client
# authentication (mutual TLS: every role is a client of another).
cert() {
  local name=$1 alt=$2
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=prl-$name" \
    -keyout "$name.key" -out "$name.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$alt" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

# The coordinator: its Service (clients, actors, the learner), its pod's name under it (a DNS
# record once that Service is headless), and localhost and 127.0.0.1 for `kubectl port-forward
# svc/prl-coordinator` and prl submit from your machine (docs/deploy.md).
cert coordinator "$(sans prl-coordinator prl-coordinator-0.prl-coordinator),DNS:localhost,IP:127.0.0.1"
# The learner pod (the learner and its replay ingest): the headless Service, rank 0's Services
# prl-replay (replay ingest) and prl-weights (weights), and every rank's pod name, among them
# MASTER_ADDR prl-learner-0.prl-learner, which the ranks dial for the rendezvous store.
pods=()
for ((i = 0; i < ranks; i++)); do pods+=("prl-learner-$i.prl-learner"); done
cert learner "$(sans prl-learner prl-replay prl-weights "${pods[@]}"),DNS:*.prl-learner.$ns,DNS:*.prl-learner.$ns.svc,DNS:*.prl-learner.$ns.svc.cluster.local"
# Actors and clients only dial: their certificates prove them to servers (mutual TLS).
cert actor "DNS:prl-actor"
cert client "DNS:prl-client"
for role in client actor learner; do
  openssl rand -hex 32 | tr -d "\n" > "token-$role"  # no newline: the file is the token
done

b64() { base64 -w0 < "$1"; }
{
  for role in coordinator learner actor client; do
    cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: prl-tls-$role
  namespace: $ns
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$role.crt")
  tls.key: $(b64 "$role.key")
  ca.crt: $(b64 ca.crt)
YAML
  done
  cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: prl-tokens
  namespace: $ns
type: Opaque
data:
  client: $(b64 token-client)
  actor: $(b64 token-actor)
  learner: $(b64 token-learner)
YAML
} > secrets.yaml
echo "make-secrets: CA, certificates and tokens in $out; Secrets in $out/secrets.yaml"
