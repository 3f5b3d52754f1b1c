#!/usr/bin/env bash
# Builds every guest component into out/:
#   out/*.wasm       the examples (a services directory you can serve as is)
#   out/test/*.wasm  test guests and deliberately bad files for the host's tests
#
# Needs: cargo with the wasm32-wasip2 target (`rustup target add wasm32-wasip2`).
# To add a guest in another language, add a build_<lang> function below and call it at the
# end; each one writes its components into "$out" or "$out/test".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/out"
# Our own target dir: the host's (possibly shared) CARGO_TARGET_DIR is for another target.
target="${GUEST_TARGET_DIR:-$here/target}"
mkdir -p "$out/test"
# Test binaries run this concurrently (e.g. under nextest): one build at a time.
if command -v flock >/dev/null; then
    exec 9>"$out/.build.lock"
    flock 9
fi

build_rust() {
    local wasm="$target/wasm32-wasip2/release"
    CARGO_TARGET_DIR="$target" cargo build --quiet --release --locked \
        --manifest-path "$here/Cargo.toml" --target wasm32-wasip2 --workspace
    # example services: file stem = service name
    cp "$wasm/rust_ticker.wasm" "$out/rust-ticker.wasm"
    cp "$wasm/rust_counter.wasm" "$out/rust-counter.wasm"
    cp "$wasm/rust-command.wasm" "$out/rust-command.wasm"
    # test guests
    local t
    for t in trap spin hog nosy other_world; do
        cp "$wasm/test_$t.wasm" "$out/test/${t//_/-}.wasm"
    done
}

bad_files() {
    # Not components: an empty file, a component cut in half, a core module.
    : >"$out/test/empty.wasm"
    local size
    size=$(wc -c <"$out/rust-ticker.wasm")
    head -c $((size / 2)) "$out/rust-ticker.wasm" >"$out/test/truncated.wasm"
    printf '\000asm\001\000\000\000' >"$out/test/core-module.wasm"
}

build_rust
bad_files
