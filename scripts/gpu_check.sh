#!/usr/bin/env bash
# The GPU check, where a lent GPU machine's instructions call it: runs
# scripts/gpu/gpu_check.sh, the script itself (docs/contributing.md).
exec bash "$(dirname "$0")/gpu/gpu_check.sh" "$@"
