#!/usr/bin/env bash
# Keeps every core of this machine busy for a bounded time, to run the tests the way a shared,
# busy machine runs them.
#
#   scripts/cpuhog.sh [-n WORKERS] [-t SECONDS]                  hog for SECONDS, then stop
#   scripts/cpuhog.sh [-n WORKERS] [-t SECONDS] -- COMMAND ARGS  run COMMAND under the hog
#
# WORKERS defaults to the number of cores (nproc) and SECONDS to 1800 (CPUHOG_SECONDS). Each
# worker is a busy shell loop at normal priority; it uses local CPU only (no disk, no network).
# The hog stops by itself after SECONDS, when COMMAND ends, or on Ctrl-C, whichever comes first.
# With a COMMAND the script exits with COMMAND's status (a COMMAND that outlives the hog keeps
# running, unloaded).
set -euo pipefail

workers=$(nproc 2>/dev/null || echo 2)
seconds=${CPUHOG_SECONDS:-1800}
while getopts "n:t:h" opt; do
	case $opt in
	n) workers=$OPTARG ;;
	t) seconds=$OPTARG ;;
	*)
		sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
		exit 2
		;;
	esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
if ! [[ $workers =~ ^[1-9][0-9]*$ && $seconds =~ ^[1-9][0-9]*$ ]]; then
	echo "cpuhog: -n and -t take positive integers (got -n $workers -t $seconds)" >&2
	exit 2
fi

pids=()
stop() {
	((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null || true
	pids=()
}
trap stop EXIT
trap 'stop; exit 130' INT TERM

# Each worker spins until its own deadline, so none outlives SECONDS even if this script is
# killed with SIGKILL and cannot clean up.
for ((i = 0; i < workers; i++)); do
	bash -c 'end=$((SECONDS + $1)); while ((SECONDS < end)); do :; done' cpuhog "$seconds" &
	pids+=($!)
done
echo "cpuhog: $workers busy loop(s) for at most ${seconds}s (load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'))" >&2

if (($# == 0)); then
	wait "${pids[@]}" 2>/dev/null || true
	exit 0
fi
status=0
"$@" || status=$?
stop
echo "cpuhog: stopped (load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'))" >&2
exit "$status"
