#!/bin/sh
# Makes what deploy/compose.yaml mounts as secrets, into deploy/secrets/ (never committed), or
# into the directory given:
#   ca.crt                  a CA of your own (clients verify the engine and the node with it;
#                           the engine's WORKFLOW_ENGINE_NODES_CA_FILE)
#   tls.crt, tls.key        the engine's certificate (localhost, engine-1, engine-2) and key
#   node-tls.crt, node-tls.key   the worker node's (localhost, worker-node-1, and the
#                           Kubernetes StatefulSet's pods worker-node-0.worker-node and
#                           worker-node-1.worker-node: add one name per replica) and key
#   tokens.json             the callers (docs/security.md): one orchestrator, one reader
#   orchestrator.token, reader.token   their bearer tokens, for grpcurl
# Every key (and ca.key, which signs them) and token is written readable by its owner only (mode
# 600: running as root, the engine refuses a key or plaintext token that others may read).
# The containers run as uid 10001 and compose mounts these files as they are, so as root this
# gives the keys to uid 10001; otherwise run: sudo chown 10001 deploy/secrets/*.key
# Usage, from the repository root:  sh deploy/make-secrets.sh [DIRECTORY]
# Kubernetes: put tls.crt/tls.key in the Secret workflow-engine-tls, node-tls.crt/node-tls.key
# in the Secret worker-node-tls (as tls.crt/tls.key), and tokens.json in the Secret
# workflow-engine-callers (see deploy/kubernetes/).
set -eu
dir="${1:-$(dirname "$0")/secrets}"
umask 077
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -subj "/CN=workflow-engine dev CA" -keyout ca.key -out ca.crt 2>/dev/null
# issue NAME SUBJECT SANS: NAME.key and NAME.crt, signed by the CA, for the names SANS.
issue() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext" ca.srl
}
issue tls workflow-engine "DNS:localhost,DNS:engine-1,DNS:engine-2,IP:127.0.0.1"
issue node-tls worker-node \
    "DNS:localhost,DNS:worker-node-1,DNS:worker-node-0.worker-node,DNS:worker-node-1.worker-node,IP:127.0.0.1"
openssl rand -hex 32 >orchestrator.token
openssl rand -hex 32 >reader.token
# Only the tokens' SHA-256 goes into the file the engine reads.
hash() { printf '%s' "$(cat "$1")" | openssl dgst -sha256 -r | cut -d' ' -f1; }
cat >tokens.json <<JSON
{"callers": [
  {"identity": "orchestrator", "role": "orchestrator", "token_sha256": "$(hash orchestrator.token)"},
  {"identity": "reader", "role": "reader", "token_sha256": "$(hash reader.token)"}
]}
JSON
# Certificates and the tokens' hashes are no secret; the keys and tokens stay 600.
chmod 644 ca.crt tls.crt node-tls.crt tokens.json
chmod 600 ca.key tls.key node-tls.key orchestrator.token reader.token
if [ "$(id -u)" = 0 ]; then
    chown 10001 tls.key node-tls.key   # the containers' user (compose mounts the files as is)
else
    echo "note: the containers (uid 10001) cannot read the keys until: sudo chown 10001 $(pwd)/tls.key $(pwd)/node-tls.key" >&2
fi
echo "made $(pwd): ca.crt tls.crt tls.key node-tls.crt node-tls.key tokens.json orchestrator.token reader.token"
