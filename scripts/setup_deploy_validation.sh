#!/usr/bin/env bash
# Installs the npm packages that validate deploy/ offline (pinned in
# deploy/validate/package-lock.json): kubernetes-models (the Kubernetes API schemas) and
# @kubernetes-models/prometheus-operator (PodMonitor). Idempotent: does nothing when node_modules
# matches the lock file. A failure is an error: the deploy tests cannot run without them.
set -euo pipefail
cd "$(dirname "$0")/../deploy/validate"
stamp=node_modules/.prl-lock-stamp
if [[ -f $stamp ]] && cmp -s package-lock.json "$stamp"; then exit 0; fi
echo "setup_deploy_validation: npm ci in $(pwd)"
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
