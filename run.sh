#!/usr/bin/env bash
# vvm-host's two entry points on a fresh machine:
#   ./run.sh serve   build the example guests and serve them from ./services with ./vvm.redb
#   ./run.sh test    install what the build needs, build the guests, run every test
# Both install their own prerequisites first (Debian packages, the wasm32-wasip2 target,
# the Python and JavaScript guest toolchains), so nothing is done by hand.
set -euo pipefail
cd "$(dirname "$0")"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

setup() {
  local need=()
  command -v protoc >/dev/null || need+=(protobuf-compiler)   # etcd-client's build script
  command -v etcd >/dev/null || need+=(etcd-server)           # the etcd backend's tests
  command -v etcdctl >/dev/null || need+=(etcd-client)
  command -v docker-registry >/dev/null || need+=(docker-registry) # OCI registry (e2e oci)
  command -v python3 >/dev/null && python3 -m venv --help >/dev/null 2>&1 ||
    need+=(python3 python3-venv)                              # componentize-py (Python guests)
  command -v npm >/dev/null || need+=(nodejs npm)             # componentize-js (JS guests)
  command -v ip >/dev/null || need+=(iproute2)                # network namespaces (etcd e2e)
  command -v prlimit >/dev/null || need+=(util-linux)         # a low open-file limit (e2e)
  if [ ${#need[@]} -gt 0 ]; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
  guest-examples/build.sh
}

case "${1:-}" in
  serve)
    shift
    setup
    mkdir -p services
    # Every example, in every language (not the test guests under out/test).
    for f in guest-examples/out/*.wasm; do
      [ -e "services/$(basename "$f")" ] || cp "$f" services/
    done
    # The HTTP examples answer on 127.0.0.1:8080 (curl 127.0.0.1:8080/rust-http/), unless
    # an address is given.
    http=()
    [[ -n "${VVM_HTTP_ADDR:-}" || " $* " == *" --http-addr"* ]] || http=(--http-addr 127.0.0.1:8080)
    exec cargo run --release -p vvm-host -- serve "${http[@]}" "$@"
    ;;
  test)
    shift
    # A fresh build and the test run take about 4 GB; say so before cargo fails mid-build.
    free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
    if [ "${free_kb:-0}" -lt $((5 * 1024 * 1024)) ]; then
      echo "run.sh: warning: $((free_kb / 1024)) MB free on $(df -P . | awk 'NR == 2 { print $6 }');" \
        "a fresh build and test run take about 4 GB" >&2
    fi
    setup
    # oras-py, a third-party OCI client the e2e tests push components with (tests/e2e/oci.rs).
    if [ ! -x target/.venv-oras/bin/python ]; then
      python3 -m venv target/.venv-oras
      target/.venv-oras/bin/pip install --quiet --disable-pip-version-check oras==0.2.43
    fi
    cargo fmt --all --check
    cargo clippy --workspace --all-targets --locked -- -D warnings
    cargo test --workspace --locked "$@"
    ;;
  *)
    echo "usage: $0 serve [vvm-host serve flags] | test [cargo test args]" >&2
    exit 2
    ;;
esac
