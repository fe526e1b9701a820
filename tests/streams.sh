#!/usr/bin/env bash
# `make test`: the suite as two pytest sessions side by side on this machine's cores.
# Host-wide tests (tests/conftest.py ``host_wide``: the session's Slurm cluster of
# separate hosts, the test users, README/deploy/demo/wheel runs) run in one session, in
# order; every other test in the other. One session alone leaves a core idle much of the
# time (unit tests are single-threaded; the end-to-end tests wait on Slurm and on each
# other's processes). The host-wide session's output follows the other's.
# usage: tests/streams.sh VENV_BIN [pytest args...]
set -u
bin=${1:?usage: tests/streams.sh VENV_BIN [pytest args...]}
shift
log=$(mktemp /tmp/weave-hostwide-XXXXXX.log)
"$bin/pytest" -q -m hostwide -p no:cacheprovider "$@" >"$log" 2>&1 &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null; wait "$pid"; cat "$log"; rm -f "$log"; exit 130' INT TERM
"$bin/pytest" -q -m "not hostwide" "$@"
rest=$?
wait "$pid"
host=$?
trap - INT TERM
echo "======================== host-wide tests (one session) ========================"
cat "$log"
rm -f "$log"
echo "make test: other tests exit $rest, host-wide tests exit $host"
[ "$rest" -eq 0 ] && [ "$host" -eq 0 ]
