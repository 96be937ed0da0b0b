#!/usr/bin/env bash
# Makes TLS material and role tokens for trying prl out (cert-manager users point the Secrets
# at their own certificates instead): a private CA, one certificate per role whose SANs are the
# role's Service names in NAMESPACE, a client certificate for prl submit/status, and one bearer
# token per role. Writes the files to OUT_DIR (owner-only) and OUT_DIR/secrets.yaml with the
# Secrets the manifests mount (prl-tls-<role>, prl-tokens); nothing is printed but paths.
#
#   deploy/k8s/make-secrets.sh OUT_DIR [NAMESPACE]     (NAMESPACE defaults to prl)
#   kubectl apply -n NAMESPACE -f OUT_DIR/secrets.yaml
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUT_DIR [NAMESPACE]" >&2
  exit 2
fi
out=$1
ns=${2:-prl}
umask 077
mkdir -p "$out"
cd "$out"

# The names each role's certificate answers to: its Services, short and qualified.
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

cert coordinator "$(sans prl-coordinator)"
cert learner "$(sans prl-learner prl-replay prl-weights),DNS:*.prl-learner,DNS:*.prl-learner.$ns.svc.cluster.local"
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
