#!/usr/bin/env bash
# Builds {{name}}.wasm from src/ for the wasm32-wasip2 target, installing the target with
# rustup on first use. Cargo.lock pins wit-bindgen; CARGO_TARGET_DIR is honoured (default
# ./target).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target="${CARGO_TARGET_DIR:-$here/target}"
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi
cargo build --quiet --release --manifest-path "$here/Cargo.toml" --target wasm32-wasip2 \
    --target-dir "$target"
cp "$target/wasm32-wasip2/release/{{crate}}.wasm" "$here/{{name}}.wasm"
echo "built $here/{{name}}.wasm"
