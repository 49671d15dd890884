#!/usr/bin/env bash
# Start a Docker engine for the sandbox tests, only when none answers yet (idempotent).
# The PID of a daemon started here is written to $DOCKERD_PIDFILE so stop-dockerd.sh stops
# exactly that one. Needs root and `apt-get install -y docker.io` (dockerd + containerd).
# Usage: infra/docker/start-dockerd.sh        (env: DOCKERD_PIDFILE, DOCKERD_LOG, DOCKERD_WAIT_S)
set -euo pipefail
PIDFILE="${DOCKERD_PIDFILE:-/tmp/cleaner-dockerd.pid}"
LOG="${DOCKERD_LOG:-/tmp/cleaner-dockerd.log}"
WAIT_S="${DOCKERD_WAIT_S:-60}"

if docker info >/dev/null 2>&1; then
    echo "start-dockerd: an engine already answers; not starting another"
    exit 0
fi
if ! command -v dockerd >/dev/null; then
    echo "start-dockerd: dockerd not found; install it with: apt-get install -y docker.io" >&2
    exit 1
fi
if [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "start-dockerd: dockerd pid $(cat "$PIDFILE") is starting; waiting for it"
else
    nohup dockerd >"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
    echo "start-dockerd: started dockerd pid $(cat "$PIDFILE") (log: $LOG)"
fi
for _ in $(seq 1 "$((WAIT_S * 4))"); do
    if docker info >/dev/null 2>&1; then
        echo "start-dockerd: engine ready"
        exit 0
    fi
    sleep 0.25
done
echo "start-dockerd: engine did not answer within ${WAIT_S}s; last log lines:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
