#!/usr/bin/env bash
# Installs the Debian packages prl's build and tests need. Idempotent: when everything is
# already installed it prints nothing and touches nothing. Needs root (or sudo) only when
# something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev         # libFuzzer target (scripts/fuzz.sh)
  libopenblas-openmp-dev           # SGEMM; the OpenMP build runs single-threaded inside our parallel regions
  libabsl-dev                      # Status, StatusOr, Span, strings
  nlohmann-json3-dev               # config.json, safetensors headers, JSONL
  libcli11-dev                     # the prl command line
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler  # gRPC services
  libboost-dev                     # Boost.Interprocess (shared-memory segments)
  libxxhash-dev                    # record checksums (XXH3)
  libgloo-dev                      # CPU collectives (learner FSDP over TCP)
  prometheus-cpp-dev               # /metrics endpoints (prometheus-cpp pull)
  openssl                          # the TLS tests make their certificates
  prometheus                       # promtool: the metrics tests lint what /metrics serves
  libpcre2-dev                     # tokenizer pre-tokenizer regexes (Unicode properties, look-ahead, JIT)
  libutf8proc-dev                  # tokenizer Unicode normalisation (NFC, NFD, NFKC, NFKD)
  libgtest-dev libgmock-dev        # unit tests
  python3 python3-numpy python3-torch  # independent float64 reference for the model tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
