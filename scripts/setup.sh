#!/usr/bin/env bash
# Installs the Debian packages prl's build and tests need: scripts/packages/build.txt (also the
# image's build stage: deploy/docker/Dockerfile) and scripts/packages/test.txt. Idempotent:
# when everything is already installed it prints nothing and touches nothing. Needs root (or
# sudo) only when something is missing.
set -euo pipefail

here=$(dirname "$0")
# One package list per purpose, one or more names a line, '#' comments.
mapfile -t PACKAGES < <(sed 's/#.*//' "$here/packages/build.txt" "$here/packages/test.txt" |
  tr -s ' \t' '\n' | sed '/^$/d')

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
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
