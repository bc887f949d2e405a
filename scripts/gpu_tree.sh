#!/usr/bin/env bash
# What travels to a lent GPU: a device call sends this checkout's working tree (tracked files and
# untracked ones git does not ignore), at most 64 MiB, and the zoo's weights alone are ~150 MiB.
# The GPU checks (scripts/gpu_validate.sh: kernels, benchmarks, kernel tests) need no model, so
# before the call the model folders leave the working tree, and come back after it:
#
#   bash scripts/gpu_tree.sh hide      # sparse checkout without hooked_models/zoo/<model>/
#   ... the device call (run: bash scripts/gpu_validate.sh) ...
#   bash scripts/gpu_tree.sh restore   # every model folder back, from git's own objects
#   bash scripts/gpu_tree.sh size      # MiB that would travel now
#
# Safe by construction: a sparse checkout only marks the folders skip-worktree, it stages no
# deletion, so `git status` stays clean and a commit made meanwhile keeps every model. While
# hidden, this machine's loader reads the models from the installed attnlens-zoo (make setup).
# Untracked files inside a model folder (a run in progress) are refused, not deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB=64

size_mib() {  # what a call would send: tracked files present on disk + untracked, not ignored
  git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
names = [n for n in sys.stdin.buffer.read().split(b"\0") if n]
print(f"{sum(os.path.getsize(n) for n in names if os.path.isfile(n)) / 2**20:.1f}")'
}

case "${1:-}" in
  hide)
    if [ -n "$(git ls-files --others --exclude-standard -- hooked_models/zoo)" ]; then
      echo "gpu_tree: untracked files under hooked_models/zoo/ (commit or move them first):" >&2
      git ls-files --others --exclude-standard -- hooked_models/zoo >&2
      exit 2
    fi
    git sparse-checkout set --no-cone '/*' '!/hooked_models/zoo/*/'
    mib=$(size_mib)
    echo "gpu_tree: model folders hidden; ${mib} MiB would travel (limit ${LIMIT_MIB})"
    awk -v m="$mib" -v l="$LIMIT_MIB" 'BEGIN {exit !(m < l)}' || {
      echo "gpu_tree: still over ${LIMIT_MIB} MiB: see 'git ls-files | xargs du -ch'" >&2; exit 3; }
    ;;
  restore)
    git sparse-checkout disable
    echo "gpu_tree: model folders restored; $(size_mib) MiB in the tree"
    ;;
  size)
    echo "$(size_mib) MiB would travel (limit ${LIMIT_MIB})"
    ;;
  *)
    echo "usage: bash scripts/gpu_tree.sh hide|restore|size" >&2
    exit 2
    ;;
esac
