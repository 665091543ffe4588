#!/usr/bin/env bash
# `make dist-check`: the built wheel works where it lands. In a fresh virtual environment (no
# -e, nothing of this checkout on the path), install dist/'s wheel for this version, then:
#   - `workflow-engine --version` says the package's version;
#   - jobwrap is in the installed package where a C compiler built the wheel, and where none
#     did, `serve` with the local sandbox refuses to start (status 2), naming it, and the
#     check goes on with the simulated worker;
#   - `workflow-engine serve` with its embedded PostgreSQL answers a gRPC health check SERVING
#     on a free port, then stops on SIGTERM with status 0, its PostgreSQL stopped and no
#     process of its own left.
set -euo pipefail
cd "$(dirname "$0")/.."

DIST=${DIST:-dist}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' workflow_engine/version.py)
# Tagged for this machine's platform: it holds jobwrap, a program for this processor.
WHEEL=$(ls "$DIST"/workflow_engine-"$VERSION"-py3-none-linux_*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || { echo "dist-check: no platform wheel for $VERSION in $DIST (make dist builds it)" >&2; exit 1; }
[ -f "$DIST/workflow_engine-$VERSION.tar.gz" ] || { echo "dist-check: no sdist in $DIST" >&2; exit 1; }

WORK=$(mktemp -d)
SERVE_PID=
say() { printf '== %s\n' "$*"; }
fail() {
  printf 'dist-check FAILED: %s\n' "$*" >&2
  [ -f "$WORK/serve.log" ] && tail -n 20 "$WORK/serve.log" >&2
  exit 1
}
cleanup() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -TERM "$SERVE_PID" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVE_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

say "a fresh venv with $WHEEL (dependencies within constraints.txt)"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --progress-bar off --upgrade pip
"$WORK/venv/bin/pip" install --quiet --progress-bar off -c constraints.txt "$WHEEL"
# From its own directory: nothing of this checkout can be imported in its place.
cd "$WORK"
PY=$WORK/venv/bin/python
CLI=$WORK/venv/bin/workflow-engine

said=$("$CLI" --version)
[ "$said" = "workflow-engine $VERSION" ] || fail "--version says '$said', not workflow-engine $VERSION"
say "$said"

jobwrap=$("$PY" -c 'import os; from workflow_engine.sandbox._wrapper import JOBWRAP; print("built" if os.access(JOBWRAP, os.X_OK) else "absent")')
if command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v musl-gcc >/dev/null 2>&1; then
  [ "$jobwrap" = built ] || fail "a C compiler is here, and the wheel has no jobwrap"
fi
say "jobwrap: $jobwrap"
if [ "$jobwrap" = absent ]; then
  code=0
  WORKFLOW_ENGINE_DATA_DIR=$WORK/refused "$CLI" serve 2>"$WORK/serve.log" || code=$?
  [ "$code" = 2 ] || fail "jobwrap is not built, and serve did not refuse to start (status $code)"
  grep -q "jobwrap, the job wrapper" "$WORK/serve.log" || fail "serve refused, without naming jobwrap"
  say "serve refuses to start without jobwrap; the rest with the simulated worker"
  export WORKFLOW_ENGINE_WORKER=simulated
fi

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "workflow-engine serve, embedded PostgreSQL, on 127.0.0.1:$PORT"
WORKFLOW_ENGINE_LISTEN=127.0.0.1:$PORT WORKFLOW_ENGINE_DATA_DIR=$WORK/data \
  "$CLI" serve 2>"$WORK/serve.log" &
SERVE_PID=$!
for i in $(seq 240); do
  status=$("$PY" - "$PORT" 2>/dev/null <<'PY' || true
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}") as channel:
    request = health_pb2.HealthCheckRequest(service="workflow_engine.v1.WorkflowEngine")
    answer = health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
PY
)
  [ "$status" = SERVING ] && break
  kill -0 "$SERVE_PID" 2>/dev/null || fail "serve exited before it served"
  [ "$i" = 240 ] && fail "no SERVING health answer in 120 s"
  sleep 0.5
done
say "health: SERVING"

kill -TERM "$SERVE_PID"
code=0
wait "$SERVE_PID" || code=$?
SERVE_PID=
[ "$code" = 0 ] || fail "serve exited $code after SIGTERM"
grep -q '"embedded_postgres_stopped"' "$WORK/serve.log" || fail "no embedded_postgres_stopped in the log"
left=$(pgrep -f -- "$WORK" || true)
[ -z "$left" ] || fail "processes left behind: $(ps -o pid=,args= -p "${left//$'\n'/,}")"
say "SIGTERM: exited 0, embedded PostgreSQL stopped, nothing left running"
say "dist-check passed"
