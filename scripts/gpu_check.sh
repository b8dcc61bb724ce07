#!/bin/sh
# The one-shot device check of Kiln's CUDA programs (docs/cuda.md).
#
#   scripts/gpu_check.sh prepare DIR   here (Go, no GPU): the programs, their inputs, the
#                                      interpreter's references and the timing programs, under 60 MiB
#   scripts/gpu_check.sh run DIR       on the GPU machine (nvcc, PyTorch, no Go): builds, runs,
#                                      compares, times against PyTorch eager, writes DIR/gpu_check.json
#
# Run both from the repository root. prepare takes -small (no CI-size ResNet-50 and GPT-2, no timing)
# and -kiln PATH; run takes --emulate DIR (the CPU emulation, for Kiln's tests) and --jobs N.
set -eu
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
	echo "usage: scripts/gpu_check.sh prepare|run DIR [options]" >&2
	exit 2
fi
what=$1
shift
case $what in
prepare) exec go run ./scripts/gpucheck prepare "$@" ;;
run) exec "${PYTHON:-python3}" scripts/gpu_check_run.py "$@" ;;
*)
	echo "usage: scripts/gpu_check.sh prepare|run DIR [options]" >&2
	exit 2
	;;
esac
