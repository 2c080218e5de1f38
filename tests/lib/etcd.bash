# A real etcd for the tests (Debian's etcd-server): members talk to each other over Unix
# sockets; clients reach a member on a Unix socket or, for nodes in network namespaces, on a
# TCP port of an address they route to (a free port, tried again should another process take
# it first).
#
#   etcd_start N [ADDR]   starts an N-member cluster in $BATS_TEST_TMPDIR/etcd; clients on
#                         ADDR:port (TCP) or, without ADDR, on Unix sockets; sets ETCD_EPS
#                         (the client URLs, comma-separated) and ETCD_EP_LIST ("[a, b]")
#   ETCD_TLS=1 etcd_start N ADDR   the same over TLS with client certificates: a test CA
#                         signs the members' and a client's certificates ($ETCD_DIR/tls:
#                         ca.pem, client.pem, client.key; etcd_certs DIR makes such a set)
#   etcd_kill K           SIGKILLs member K (0-based)
#   etcd_keys             every key in the cluster, one per line
#   etcd_teardown         stops the members

need_etcd() {
  [ -x /usr/bin/etcd ] || fail "etcd is not installed (./dev.sh deps installs etcd-server)"
}

etcd_free_port() {
  local p
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % 20000)) # below the kernel's range for outgoing connections
    [ -n "$(ss -Htan "sport = :$p")" ] || { echo "$p"; return 0; } # no socket of any state
  done
  return 1
}

etcd_certs() { # dir: a CA, a server certificate for 127.0.0.1 and the 10.213.* test hosts' login
  # side, and a client certificate (EC keys: quick to make)
  local d=$1 n ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  openssl req -x509 $ec -keyout "$d/ca.key" -out "$d/ca.pem" -days 2 -subj /CN=ddprun-test-ca 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$d/server.ext"
  printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
  for n in server client; do
    # shellcheck disable=SC2086
    openssl req $ec -keyout "$d/$n.key" -out "$d/$n.csr" -subj "/CN=$n" 2>/dev/null
    openssl x509 -req -in "$d/$n.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -out "$d/$n.pem" -days 2 -extfile "$d/$n.ext" 2>/dev/null
  done
}

etcd_start() {
  local n=$1 addr=${2:-} try m cluster="" url
  ETCD_DIR="$BATS_TEST_TMPDIR/etcd"
  for try in 1 2 3; do
    rm -rf "$ETCD_DIR"
    mkdir -p "$ETCD_DIR"
    cluster=""
    # etcd takes unix://NAME:PORT, a socket named NAME:PORT in its working folder
    for m in $(seq 0 $((n - 1))); do cluster="$cluster${cluster:+,}m$m=unix://p$m:0"; done
    ETCD_EPS=""
    ETCD_PIDS=()
    local scheme=http tls=()
    if [ -n "${ETCD_TLS:-}" ]; then
      etcd_certs "$ETCD_DIR/tls"
      scheme=https
      tls=(--cert-file "$ETCD_DIR/tls/server.pem" --key-file "$ETCD_DIR/tls/server.key"
        --client-cert-auth --trusted-ca-file "$ETCD_DIR/tls/ca.pem")
    fi
    for m in $(seq 0 $((n - 1))); do
      if [ -n "$addr" ]; then
        url="$scheme://$addr:$(etcd_free_port)"
        ETCD_EPS="$ETCD_EPS${ETCD_EPS:+,}$url"
      else
        url="unix://c$m:0"
        ETCD_EPS="$ETCD_EPS${ETCD_EPS:+,}unix://$ETCD_DIR/c$m:0" # ddprun's: the socket's path
      fi
      (cd "$ETCD_DIR" && exec /usr/bin/etcd --name "m$m" --data-dir "d$m" \
        --listen-client-urls "$url" --advertise-client-urls "$url" \
        --listen-peer-urls "unix://p$m:0" --initial-advertise-peer-urls "unix://p$m:0" \
        --initial-cluster "$cluster" --initial-cluster-state new "${tls[@]}" >"m$m.log" 2>&1) &
      ETCD_PIDS+=($!)
    done
    for _ in $(seq 100); do
      etcd_get_ok && break
      sleep 0.1
    done
    etcd_get_ok && break
    etcd_teardown
  done
  etcd_get_ok || { tail -n 5 "$ETCD_DIR"/m*.log; return 1; }
  ETCD_EP_LIST="[${ETCD_EPS//,/, }]"
}

# curl arguments for member K's client URL
etcd_curl() {
  local url
  url=$(cut -d, -f$(($1 + 1)) <<<"$ETCD_EPS")
  shift
  case "$url" in
  unix://*) curl -s --max-time 2 --unix-socket "${url#unix://}" "http://localhost$1" "${@:2}" ;;
  https://*) curl -s --max-time 2 --cacert "$ETCD_DIR/tls/ca.pem" --cert "$ETCD_DIR/tls/client.pem" \
    --key "$ETCD_DIR/tls/client.key" "$url$1" "${@:2}" ;;
  *) curl -s --max-time 2 "$url$1" "${@:2}" ;;
  esac
}

etcd_get_ok() {
  local m
  [ "${#ETCD_PIDS[@]}" -gt 0 ] || return 1
  for m in $(seq 0 $((${#ETCD_PIDS[@]} - 1))); do
    etcd_curl "$m" /health | grep -q '"health":"true"' || return 1
  done
}

etcd_kill() {
  kill -9 "${ETCD_PIDS[$1]}"
}

etcd_keys() { # from the first member that answers
  local m
  for m in $(seq 0 $((${#ETCD_PIDS[@]} - 1))); do
    if etcd_curl "$m" /v3/kv/range -d '{"key":"AA==","range_end":"AA==","keys_only":true}' \
      >"$ETCD_DIR/keys.json" 2>/dev/null && [ -s "$ETCD_DIR/keys.json" ]; then
      /usr/bin/python3 -c '
import base64, json, sys
for kv in json.load(open(sys.argv[1])).get("kvs", []):
    print(base64.b64decode(kv["key"]).decode())' "$ETCD_DIR/keys.json"
      return 0
    fi
  done
  return 1
}

etcd_teardown() {
  local p
  for p in "${ETCD_PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${ETCD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  ETCD_PIDS=()
}
