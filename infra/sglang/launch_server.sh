#!/usr/bin/env bash
# Launch a real SGLang server (GPU) for a CLEANER run config, on 127.0.0.1, and write its PID.
#
#   infra/sglang/launch_server.sh configs/tiny.yaml [PORT]        # model path read from the config
#   MODEL_PATH=/ckpt/qwen3-4b infra/sglang/launch_server.sh - 30000
#
# Then train with: --set engine.kind=sglang --set "engine.server_urls=[http://127.0.0.1:PORT]".
# The server runs in its own process group; stop it with: kill -- -$(cat "$PID_FILE").
# Extra server flags go in SGLANG_ARGS (e.g. "--tp 2 --mem-fraction-static 0.7"); several servers
# behind one URL: `python -m sglang_router.launch_router --worker-urls ...` (see docs/run_at_scale.md).
# Needs the [gpu] extra (pip install -e '.[gpu]') on a CUDA machine; never on CPU machines.
set -euo pipefail
CONFIG=${1:?usage: launch_server.sh CONFIG.yaml|- [PORT]}
PORT=${2:-30000}
PYTHON=${PYTHON:-python}
RUN_DIR=${RUN_DIR:-runs/sglang}
PID_FILE=${PID_FILE:-$RUN_DIR/server-$PORT.pid}
LOG_FILE=${LOG_FILE:-$RUN_DIR/server-$PORT.log}
HEALTH_TIMEOUT_S=${HEALTH_TIMEOUT_S:-600}

if [[ -z "${MODEL_PATH:-}" ]]; then
  [[ "$CONFIG" != "-" ]] || { echo "launch_server.sh: set MODEL_PATH when no config is given" >&2; exit 2; }
  # model.base when set (a LoRA adapter policy: the server starts on the base, the engine then loads merged weights)
  MODEL_PATH=$("$PYTHON" -c 'import sys, yaml; m = (yaml.safe_load(open(sys.argv[1])) or {}).get("model", {}); print(m.get("base") or m.get("path", "assets/tiny-warm"))' "$CONFIG")
fi
[[ -e "$MODEL_PATH/config.json" ]] || { echo "launch_server.sh: model.path $MODEL_PATH has no config.json" >&2; exit 2; }
"$PYTHON" -c 'import sglang' 2>/dev/null || { echo "launch_server.sh: sglang is not installed (pip install -e '.[gpu]' on a CUDA machine)" >&2; exit 2; }

mkdir -p "$RUN_DIR"
# shellcheck disable=SC2086
setsid "$PYTHON" -m sglang.launch_server --model-path "$MODEL_PATH" --host 127.0.0.1 --port "$PORT" \
  --skip-server-warmup ${SGLANG_ARGS:-} >"$LOG_FILE" 2>&1 &
echo $! >"$PID_FILE"
echo "sglang server pid $(cat "$PID_FILE") on http://127.0.0.1:$PORT (log $LOG_FILE)"

deadline=$((SECONDS + HEALTH_TIMEOUT_S))
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "launch_server.sh: server exited; last log lines:" >&2; tail -20 "$LOG_FILE" >&2; exit 1
  fi
  if (( SECONDS > deadline )); then
    echo "launch_server.sh: http://127.0.0.1:$PORT not healthy after ${HEALTH_TIMEOUT_S}s (log $LOG_FILE)" >&2; exit 1
  fi
  sleep 2
done
echo "healthy: http://127.0.0.1:$PORT"
