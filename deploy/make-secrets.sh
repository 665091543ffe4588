#!/bin/sh
# Makes what deploy/compose.yaml mounts as secrets, into deploy/secrets/ (never committed), or
# into the directory given:
#   ca.crt                  a CA of your own (clients verify the engine with it)
#   tls.crt, tls.key        the engine's certificate (localhost, engine-1, engine-2) and key
#   tokens.json             the callers (README, "Security"): one orchestrator, one reader
#   orchestrator.token, reader.token   their bearer tokens, for grpcurl
# Every key and token is its owner's alone (mode 600; running as root, the engine refuses a key
# or plaintext token that others may read); the certificates, and tokens.json (the tokens'
# SHA-256 only), may be read by anyone (644).
# Usage, from the repository root:  sh deploy/make-secrets.sh [DIR]
# Compose bind-mounts these files as they are, and its engines run as the image's user (uid
# 10001), which cannot read a key that is yours alone: give it the key first,
#   sudo chown 10001 deploy/secrets/tls.key
# Kubernetes: put tls.crt/tls.key in the Secret workflow-engine-tls and tokens.json in the
# Secret workflow-engine-callers (see deploy/kubernetes/workflow-engine.yaml).
set -eu
umask 077
dir="${1:-$(dirname "$0")/secrets}"
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -subj "/CN=workflow-engine dev CA" -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=workflow-engine" \
    -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,DNS:engine-1,DNS:engine-2,IP:127.0.0.1\n' >san.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile san.ext -out tls.crt 2>/dev/null
rm -f tls.csr san.ext ca.srl
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
# Files that existed before keep their mode through a rewrite: set every one.
chmod 600 ca.key tls.key orchestrator.token reader.token
chmod 644 ca.crt tls.crt tokens.json
echo "made $(pwd): ca.crt tls.crt tls.key tokens.json orchestrator.token reader.token"
