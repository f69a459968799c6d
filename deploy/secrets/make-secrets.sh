#!/usr/bin/env bash
# Makes the secrets the deploy examples mount, in DIR (default: the
# directory of this script), with openssl:
#
#   ca.crt                  a CA of your own, for clients to trust
#   tls.crt, tls.key        the gRPC port's certificate (localhost, 127.0.0.1,
#                           hourglass, hourglass.<namespace>.svc, the cluster
#                           examples' node names...) and key
#   tokens.toml             one token, "admin", for every topic and every
#                           tenant's policies (admin = "all": the console's
#                           cluster page, `hourglass topic pause`), kept as
#                           its SHA-256 only
#   admin-token             that token, for clients (--token, HOURGLASS_TOKEN)
#   cluster.key             the key a cluster's nodes seal their records with
#                           (--cluster-key-file), the same for every node
#
#   bash deploy/secrets/make-secrets.sh [DIR] [NAMESPACE]
#
# Existing files are kept: delete them to make new ones. Nothing here is
# committed; each deployment makes its own. Replace the CA with your own
# for production, and add a [[token]] per client with only its topics.
set -euo pipefail
dir="${1:-$(dirname "$0")}"
namespace="${2:-default}"
umask 077
mkdir -p "$dir"
cd "$dir"

if [ ! -f ca.crt ]; then
  openssl req -x509 -newkey rsa:3072 -sha256 -days 825 -nodes -subj "/CN=hourglass example CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
fi
if [ ! -f tls.crt ]; then
  openssl req -newkey rsa:3072 -sha256 -nodes -subj "/CN=hourglass" -keyout tls.key -out tls.csr 2>/dev/null
  # The nodes of a cluster reach each other by name too: hourglass-1..3 in
  # docker-compose.cluster.yml, <pod>.hourglass-cluster.<namespace>.svc in
  # kubernetes/cluster.
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:hourglass,DNS:hourglass.%s.svc,DNS:hourglass.%s.svc.cluster.local,DNS:hourglass-1,DNS:hourglass-2,DNS:hourglass-3,DNS:*.hourglass-cluster.%s.svc\n' \
    "$namespace" "$namespace" "$namespace" >tls.ext
  openssl x509 -req -sha256 -days 825 -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
    -extfile tls.ext -out tls.crt 2>/dev/null
  rm -f tls.csr tls.ext ca.srl
fi
if [ ! -f tokens.toml ]; then
  token="$(openssl rand -hex 32)"
  printf '%s\n' "$token" >admin-token
  digest="$(printf %s "$token" | openssl dgst -sha256 -r | cut -d' ' -f1)"
  cat >tokens.toml <<TOML
# hourglass tokens (see docs/OPERATIONS.md, Security). Only the token's
# SHA-256 is here; the token itself is in admin-token, for clients.
[[token]]
name = "admin"
sha256 = "$digest"
topics = ["*"]
admin = "all"
TOML
fi
if [ ! -f cluster.key ]; then
  openssl rand -hex 32 >cluster.key
fi
# The server runs as uid 10001 in the container, which mounts these files
# one by one: it must be able to read them. The directory keeps other
# users of this machine out.
chmod 700 .
chmod 644 ca.crt tls.crt tls.key tokens.toml cluster.key
chmod 600 ca.key admin-token
echo "secrets in $(pwd): ca.crt tls.crt tls.key tokens.toml admin-token cluster.key"
