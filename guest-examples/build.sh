#!/usr/bin/env bash
# Builds every guest component into out/:
#   out/*.wasm       the examples (a services directory you can serve as is)
#   out/test/*.wasm  test guests and deliberately bad files for the host's tests
#
# Needs: cargo with the wasm32-wasip2 target (`rustup target add wasm32-wasip2`), python3
# (>= 3.10, with venv and pip) and node (>= 18) with npm. The Python and JavaScript toolchains
# are pinned (python-ticker/requirements.txt, js-ticker/package-lock.json) and installed here
# on first use: componentize-py into .venv/, componentize-js into js-ticker/node_modules/.
# A component is rebuilt only when a source, the WIT or the pinned toolchain is newer.
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
    for t in trap spin hog nosy effects journal kv_flood kv_bench other_world leak http_client http_hello http_both; do
        cp "$wasm/test_$t.wasm" "$out/test/${t//_/-}.wasm"
    done
}

wit="$here/../wit"

# True if $1 is missing or older than any file under the other arguments.
stale() {
    local target=$1
    shift
    [[ ! -e "$target" ]] || [[ -n "$(find "$@" -newer "$target" -print -quit)" ]]
}

build_python() {
    local src="$here/python-ticker" venv="$here/.venv"
    # (Re)install the pinned componentize-py when the pin is newer than the last install.
    if stale "$venv/.installed" "$src/requirements.txt"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$src/requirements.txt"
        touch "$venv/.installed"
    fi
    if stale "$out/python-ticker.wasm" "$src"/*.py "$wit" "$venv/.installed"; then
        # Bindings are generated into the build, not kept in the tree.
        "$venv/bin/componentize-py" --quiet -d "$wit" -w service componentize \
            -p "$src" app -o "$out/python-ticker.wasm.tmp"
        mv "$out/python-ticker.wasm.tmp" "$out/python-ticker.wasm"
    fi
}

build_js() {
    local src="$here/js-ticker" installed="$here/js-ticker/node_modules/.installed"
    # Install the locked componentize-js when the lock is newer than the last install. Not
    # `npm ci`: the lock lacks some other platforms' optional binaries, which `npm ci` rejects.
    if stale "$installed" "$src/package-lock.json"; then
        (cd "$src" && npm install --no-audit --no-fund --loglevel=error)
        touch "$installed"
    fi
    if stale "$out/js-ticker.wasm" "$src/ticker.js" "$src/build.mjs" "$wit" "$installed"; then
        node "$src/build.mjs" "$out/js-ticker.wasm.tmp"
        mv "$out/js-ticker.wasm.tmp" "$out/js-ticker.wasm"
    fi
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
build_python
build_js
bad_files
