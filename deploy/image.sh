#!/usr/bin/env bash
# `make image` and `make image-test`: build the engine's image and smoke-test it, as root,
# with packages from the registries only (no container registry is needed).
#
#   deploy/image.sh build   the base images (Debian 12 by mmdebstrap, kept in podman's
#                           storage between runs), then deploy/Dockerfile with buildah
#   deploy/image.sh test    its version label and --version, then
#                           the image beside a PostgreSQL container: reflection, the README
#                           workflow, health, its user, a read-only root, no zombies, readiness
#                           following the database, a SIGTERM drain, and a SIGTERM
#                           during start-up
set -euo pipefail
cd "$(dirname "$0")/.."

# The version is written once, in workflow_engine/version.py: the image's tag and its
# org.opencontainers.image.version label are it.
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' workflow_engine/version.py)
[ -n "$VERSION" ] || { echo "no __version__ in workflow_engine/version.py" >&2; exit 1; }
IMAGE=${IMAGE:-localhost/workflow-engine:$VERSION}
BASE_PACKAGES=python3,python3-venv,ca-certificates,util-linux,procps,tini
PG_PACKAGES=postgresql-15
# Named for what they hold, so a changed package list makes a new base.
BASE=localhost/workflow-engine-base:bookworm-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8)
PG_IMAGE=localhost/workflow-engine-pg:bookworm-$(echo "$PG_PACKAGES" | sha256sum | cut -c1-8)
PORT=${IMAGE_TEST_PORT:-50181}
PG_PORT=${IMAGE_TEST_PG_PORT:-55432}
GRPCURL=.venv/bin/grpcurl
CLI=.venv/bin/workflow-engine
# runc here may not raise limits above the host's (root lacks CAP_SYS_RESOURCE on some
# machines), and podman's defaults are higher: ask for less.
RUN=(podman run --runtime runc --ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

say() { printf '== %s\n' "$*"; }
fail() { printf 'image-test FAILED: %s\n' "$*" >&2; exit 1; }

make_base() { # NAME PACKAGES
  if podman image exists "$1"; then
    say "base $1: cached"
  else
    say "base $1: mmdebstrap bookworm with $2"
    mmdebstrap --quiet --variant=minbase --include="$2" bookworm - | podman import --quiet - "$1" >/dev/null
  fi
}

build() {
  make_base "$BASE" "$BASE_PACKAGES"
  make_base "$PG_IMAGE" "$PG_PACKAGES"
  # The build's pip trusts what this host trusts (a proxy's CA, if the network has one).
  local ca=()
  [ -f /etc/ssl/certs/ca-certificates.crt ] &&
    ca=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  say "building $IMAGE (cached layers are reused)"
  # The base is made once and then kept: the image names the very base it was built on.
  local digest
  digest=$(podman image inspect --format '{{.Digest}}' "$BASE")
  buildah bud --quiet --layers --format docker --isolation chroot "${ca[@]}" --build-arg "BASE=$BASE" \
    --build-arg "VERSION=$VERSION" \
    --label "org.opencontainers.image.base.name=$BASE" \
    --label "org.opencontainers.image.base.digest=$digest" \
    -f deploy/Dockerfile -t "$IMAGE" . >/dev/null
  say "built $IMAGE on $BASE@$digest: $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes"
}

cleanup() { podman rm -f --ignore we-image-test we-image-early we-image-pg >/dev/null 2>&1 || true; }

wait_for() { # DESCRIPTION COMMAND...
  local what=$1; shift
  for _ in $(seq 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  fail "timed out waiting for $what"
}

health() { # SERVICE -> SERVING | NOT_SERVING
  podman exec we-image-test python -c "import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; print(h.HealthCheckResponse.ServingStatus.Name(g.HealthStub(grpc.insecure_channel('127.0.0.1:50052')).Check(h.HealthCheckRequest(service='$1'), timeout=3).status))"
}

start_pg() {
  "${RUN[@]}" -d --name we-image-pg --network host --user postgres "$PG_IMAGE" sh -c \
    "/usr/lib/postgresql/15/bin/initdb --no-sync -E UTF8 --locale=C.UTF-8 -D /tmp/pg -A trust -U postgres >/dev/null && exec /usr/lib/postgresql/15/bin/postgres -D /tmp/pg -p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" >/dev/null
  wait_for "PostgreSQL" podman exec we-image-pg /usr/lib/postgresql/15/bin/pg_isready -q -h 127.0.0.1 -p "$PG_PORT"
}

test_image() {
  trap cleanup EXIT
  cleanup
  say "PostgreSQL beside it on 127.0.0.1:$PG_PORT"
  start_pg
  local label
  label=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "$IMAGE")
  [ "$label" = "$VERSION" ] || fail "the image's version label is '$label', not $VERSION"
  [ "$("${RUN[@]}" --rm "$IMAGE" --version)" = "workflow-engine $VERSION" ] ||
    fail "the image's workflow-engine --version does not say $VERSION"
  say "version $VERSION: the image's label and its workflow-engine --version"
  say "the engine: read-only root, a data volume, its own user, on 127.0.0.1:$PORT"
  "${RUN[@]}" -d --name we-image-test --network host --read-only --tmpfs /tmp \
    -v we-image-test-data:/home/engine/data --security-opt seccomp=unconfined \
    -e WORKFLOW_ENGINE_LISTEN=127.0.0.1:$PORT -e WORKFLOW_ENGINE_PROCESSES=1 \
    -e WORKFLOW_ENGINE_READINESS_INTERVAL_SECONDS=1 \
    -e WORKFLOW_ENGINE_DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres" \
    "$IMAGE" >/dev/null
  wait_for "the engine to serve" "$GRPCURL" -plaintext "127.0.0.1:$PORT" list
  "$GRPCURL" -plaintext "127.0.0.1:$PORT" list | grep -qx workflow_engine.v1.WorkflowEngine ||
    fail "reflection does not list the service"
  say "reflection lists: $("$GRPCURL" -plaintext "127.0.0.1:$PORT" list | tr '\n' ' ')"
  [ "$(health workflow_engine.v1.WorkflowEngine)" = SERVING ] || fail "health is not SERVING"
  [ "$(podman exec we-image-test id -u)" = 10001 ] || fail "the engine does not run as 10001"
  podman exec we-image-test touch /opt/venv/x 2>/dev/null && fail "the root filesystem is writable"
  podman healthcheck run we-image-test >/dev/null || fail "the image's HEALTHCHECK fails"
  say "health SERVING, the image's HEALTHCHECK passes, uid 10001, root filesystem read-only"

  say "the README workflow, with the command line"
  local task
  task=$(python3 -c 'import uuid; print(uuid.uuid4())')
  "$GRPCURL" -plaintext -d '{"task_id": "'"$task"'", "task": {"prompt": "Write a greeting, then check it", "steps": [{"id": "write", "command": ["sh", "-c", "echo hello > /tmp/greeting-$WORKFLOW_ENGINE_TASK_ID"]}, {"id": "check", "command": ["sh", "-c", "cat /tmp/greeting-$WORKFLOW_ENGINE_TASK_ID"], "expect": [{"kind": "stdout_contains", "value": "hello"}]}]}}' \
    "127.0.0.1:$PORT" workflow_engine.v1.WorkflowEngine/StartWorkflow >/dev/null
  "$CLI" watch "$task" --address "127.0.0.1:$PORT" >/dev/null || fail "the README workflow did not succeed"
  podman logs we-image-test 2>&1 | grep -q sandbox_task_namespaces_unavailable &&
    fail "the tasks' namespaces could not be made in the container (each job made its own)"
  podman exec we-image-test ps -eo args= | grep -q -- "--namespaces userns" ||
    fail "no namespace helper (jobwrap --namespaces userns) in the container"
  say "README workflow SUCCEEDED, its jobs through jobwrap, in its task's user and network namespaces"
  local zombies
  zombies=$(podman exec we-image-test ps -eo stat= | grep -c '^Z' || true)
  [ "$zombies" = 0 ] || fail "$zombies zombie process(es) after the jobs"
  say "no zombies after its jobs"

  say "readiness follows the database"
  podman stop -t 2 we-image-pg >/dev/null
  wait_for "NOT_SERVING without a database" sh -c "[ \"\$($(declare -f health); health workflow_engine.v1.WorkflowEngine)\" = NOT_SERVING ]"
  [ "$(health '')" = SERVING ] || fail "the server's own status changed (liveness would restart it)"
  podman rm -f we-image-pg >/dev/null
  start_pg
  wait_for "SERVING with the database back" sh -c "[ \"\$($(declare -f health); health workflow_engine.v1.WorkflowEngine)\" = SERVING ]"
  say "NOT_SERVING without its database, SERVING again with it"

  say "SIGTERM drains and exits"
  local started code
  started=$(date +%s)
  podman stop -t 30 we-image-test >/dev/null
  code=$(podman inspect --format '{{.State.ExitCode}}' we-image-test)
  [ "$code" = 0 ] || fail "exit code $code after SIGTERM"
  podman logs we-image-test 2>&1 | grep -q '"event": "stopped"' || fail "no 'stopped' in the log"
  say "drained and exited 0 in $(( $(date +%s) - started )) s"
  podman volume rm -f we-image-test-data >/dev/null

  say "SIGTERM during start-up (its database not there yet) stops it at once"
  podman rm -f we-image-pg >/dev/null
  "${RUN[@]}" -d --name we-image-early --network host --read-only --tmpfs /tmp \
    -e WORKFLOW_ENGINE_LISTEN=127.0.0.1:$PORT -e WORKFLOW_ENGINE_PROCESSES=1 \
    -e WORKFLOW_ENGINE_DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres" \
    "$IMAGE" >/dev/null
  wait_for "the engine to wait for its database" sh -c "podman logs we-image-early 2>&1 | grep -q 'error connecting'"
  started=$(date +%s)
  podman stop -t 20 we-image-early >/dev/null
  code=$(podman inspect --format '{{.State.ExitCode}}' we-image-early)
  [ "$code" = 0 ] || fail "exit code $code after SIGTERM during start-up (137: it was ignored)"
  say "exited 0 in $(( $(date +%s) - started )) s"
  say "image-test passed"
}

case "${1:-}" in
  build) build ;;
  test) test_image ;;
  *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac
