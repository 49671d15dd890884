#!/usr/bin/env bash
# Stop the dockerd that start-dockerd.sh started (by the PID it recorded); an engine that was
# already running before is left alone. Idempotent. Usage: infra/docker/stop-dockerd.sh
set -euo pipefail
PIDFILE="${DOCKERD_PIDFILE:-/tmp/cleaner-dockerd.pid}"
WAIT_S="${DOCKERD_WAIT_S:-30}"

if [ ! -s "$PIDFILE" ]; then
    echo "stop-dockerd: no pid file ($PIDFILE); nothing started here to stop"
    exit 0
fi
PID="$(cat "$PIDFILE")"
if kill -0 "$PID" 2>/dev/null && grep -q dockerd "/proc/$PID/cmdline" 2>/dev/null; then
    kill -TERM "$PID"
    for _ in $(seq 1 "$((WAIT_S * 4))"); do
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$PID" 2>/dev/null; then
        echo "stop-dockerd: dockerd $PID ignored SIGTERM for ${WAIT_S}s; sending SIGKILL" >&2
        kill -KILL "$PID"
    fi
    echo "stop-dockerd: stopped dockerd pid $PID"
else
    echo "stop-dockerd: dockerd pid $PID is not running"
fi
rm -f "$PIDFILE"
