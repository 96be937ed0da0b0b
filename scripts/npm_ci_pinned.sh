#!/usr/bin/env bash
# npm_ci_pinned.sh DIR NAME WHAT: installs DIR's npm packages exactly as its package-lock.json
# pins them (npm ci). Idempotent: does nothing when node_modules matches the lock file. Without
# node/npm or the registry it prints why (as NAME) and exits 0: WHAT then skip, naming NAME.
set -euo pipefail
dir=$1 name=$2 what=$3
cd "$dir"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "$name: node/npm not found; $what will skip"
  exit 0
fi
stamp=node_modules/.prl-lock-stamp
if [[ -f $stamp ]] && cmp -s package-lock.json "$stamp"; then exit 0; fi
echo "$name: npm ci in $(pwd)"
if npm ci --no-audit --no-fund --loglevel=error; then
  cp package-lock.json "$stamp"
else
  echo "$name: npm ci failed; $what will skip"
fi
