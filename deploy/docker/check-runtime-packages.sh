#!/usr/bin/env bash
# Checks that scripts/packages/runtime.txt is exactly what the prl binary needs at run time:
# every shared library `ldd prl` resolves comes from a Debian package of the list (dpkg -S),
# nothing is unresolved, and every package of the list provides a library prl loads. CUDA
# libraries are exempt (in a CUDA build they come from the CUDA base image, not a package).
#
#   deploy/docker/check-runtime-packages.sh PATH_TO_PRL [RUNTIME_LIST]
set -euo pipefail

prl=${1:?usage: $0 PATH_TO_PRL [RUNTIME_LIST]}
list=${2:-$(dirname "$0")/../../scripts/packages/runtime.txt}

# The list's package names (comments and blank lines dropped, several per line allowed).
mapfile -t listed < <(sed 's/#.*//' "$list" | tr -s ' \t' '\n' | sed '/^$/d' | sort -u)

declare -A is_listed=()
for pkg in "${listed[@]}"; do is_listed[$pkg]=1; done

failures=0
declare -A used=()
while read -r name arrow path _; do
  [[ $arrow == "=>" ]] || continue
  if [[ $name =~ ^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-ml|nvrtc|curand)\. ]]; then
    echo "cuda: $name (from the CUDA base image or the node's driver)"
    continue
  fi
  if [[ $path == "not" ]]; then
    echo "FAIL: $name is not found by the dynamic loader" >&2
    failures=$((failures + 1))
    continue
  fi
  pkg=$(dpkg -S "$(realpath "$path")" 2>/dev/null || dpkg -S "$path" 2>/dev/null || true)
  pkg=${pkg%%:*}
  if [[ -z $pkg ]]; then
    echo "FAIL: $path ($name) belongs to no Debian package" >&2
    failures=$((failures + 1))
  elif [[ -n ${is_listed[$pkg]:-} ]]; then  # (not `printf | grep -q`: under pipefail, grep
    # leaving early can SIGPIPE printf and turn a match into a miss)
    used[$pkg]=1
    echo "ok: $name from $pkg"
  else
    echo "FAIL: $name comes from $pkg, which $list does not list" >&2
    failures=$((failures + 1))
  fi
done < <(ldd "$prl")

for pkg in "${listed[@]}"; do
  if [[ -z ${used[$pkg]:-} ]]; then
    echo "FAIL: $list lists $pkg but prl loads no library of it" >&2
    failures=$((failures + 1))
  fi
done
echo "runtime packages: ${#listed[@]} listed, ${#used[@]} providing prl's libraries, $failures problem(s)"
[[ $failures -eq 0 ]]
