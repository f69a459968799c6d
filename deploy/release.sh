#!/usr/bin/env bash
# Builds the release artifacts of the checked-out commit, the same way
# every time, into dist/ (or --out DIR):
#
#   hourglass-VERSION-x86_64-linux-gnu.tar.gz   the server and command line
#       (and hourglass-bench), LICENSE, README.md, CHANGELOG.md, docs/,
#       the example config and the deploy/ files
#   hourglass_kafka-VERSION-py3-none-any.whl    the Python client
#   hourglass_kafka-VERSION.tar.gz              its source distribution
#   hourglass-kafka-VERSION.tgz                 the TypeScript client (npm)
#   hourglass-kafka-VERSION.crate               the Rust client (crates.io)
#   SHA256SUMS                                  the checksum of each
#
# The container image is built from the same source by deploy/Dockerfile
# (`docker build --build-arg HOURGLASS_COMMIT=... -f deploy/Dockerfile .`),
# where a Docker engine is.
#
#   bash deploy/release.sh                    # release build, then pack
#   bash deploy/release.sh --binaries DIR     # pack binaries built already
#   bash deploy/release.sh --binaries DIR --allow-dirty   # the commit, beside changes
#
# Archives are made reproducibly from the commit: files sorted, owned by
# root, dated at the commit (SOURCE_DATE_EPOCH), gzip without a name or
# time; all but the Python sdist, whose gzip header setuptools dates now.
# It refuses a tree with uncommitted changes, and versions that disagree
# between the server and the three clients.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/dist"
binaries=""
allow_dirty=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$(realpath -m "$2"); shift 2 ;;
        --binaries) binaries=$(realpath "$2"); shift 2 ;;
        --allow-dirty) allow_dirty=1; shift ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "release.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$root"
# Modes as written, whatever the caller's umask.
umask 022

fail() { echo "release.sh: $*" >&2; exit 1; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    [ "$allow_dirty" = 1 ] || fail "the tree has uncommitted changes (commit them, or --allow-dirty)"
    # What is packed is the commit; a build of this tree would not be it.
    [ -n "$binaries" ] || fail "--allow-dirty packs binaries built already: give --binaries"
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -e "$out/SHA256SUMS" ]; then
    fail "$out holds files of its own (not a release's): give an empty or new --out"
fi

# One version everywhere, as committed (what is packed is the commit).
committed() { git show "HEAD:$1"; }
toml_version() { committed "$1" | sed -n 's/^version = "\(.*\)"/\1/p' | head -1; }
version=$(toml_version Cargo.toml)
declare -A versions=(
    [clients/rust/Cargo.toml]=$(toml_version clients/rust/Cargo.toml)
    [clients/python/pyproject.toml]=$(toml_version clients/python/pyproject.toml)
    [clients/typescript/package.json]=$(committed clients/typescript/package.json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
)
for file in "${!versions[@]}"; do
    [ "${versions[$file]}" = "$version" ] || fail "$file says ${versions[$file]}, Cargo.toml says $version"
done
grep -q "^## $version (" <(committed CHANGELOG.md) || fail "CHANGELOG.md has no section '## $version (date)'"

commit=$(git log -1 --format='%h %cs' --abbrev=12)
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export HOURGLASS_COMMIT="$commit"

if [ -z "$binaries" ]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hourglass/target}"
    cargo build --release --locked --package hourglass --bin hourglass --package hourglass-bench
    binaries="$CARGO_TARGET_DIR/release"
fi
for bin in hourglass hourglass-bench; do
    [ -x "$binaries/$bin" ] || fail "$binaries/$bin is not there (build it, or give --binaries)"
done
said=$("$binaries/hourglass" --version)
[ "$said" = "hourglass $version ($commit)" ] ||
    fail "$binaries/hourglass says '$said', not 'hourglass $version ($commit)': built from another commit?"

rm -rf "$out"
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# Everything is packed from the commit: nothing local slips in.
mkdir "$stage/tree"
git archive --format=tar HEAD | tar -x -C "$stage/tree"

# A tar.gz of DIR (under PARENT) that is the same for the same files.
pack() {
    local parent=$1 dir=$2 archive=$3
    tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --mode=go-w \
        --format=gnu -C "$parent" -cf - "$dir" | gzip -n -9 > "$archive"
}

# The server.
name="hourglass-$version-x86_64-linux-gnu"
mkdir -p "$stage/$name/bin"
install -m 0755 "$binaries/hourglass" "$binaries/hourglass-bench" "$stage/$name/bin/"
strip "$stage/$name/bin/"* 2>/dev/null || true
for part in LICENSE README.md CHANGELOG.md docs deploy; do
    cp -r "$stage/tree/$part" "$stage/$name/"
done
pack "$stage" "$name" "$out/$name.tar.gz"

# The clients, with the license.
for client in python typescript rust; do
    cp "$stage/tree/LICENSE" "$stage/tree/clients/$client/LICENSE"
done
python3 -m build --sdist --wheel --outdir "$out" "$stage/tree/clients/python" >/dev/null
(cd "$stage/tree/clients/typescript" && npm pack --silent --pack-destination "$out" >/dev/null)
# The crate, as crates.io takes it: its own dependencies, not the
# workspace's paths.
cargo package --quiet --locked --offline --no-verify --allow-dirty --package hourglass-kafka \
    --manifest-path "$stage/tree/Cargo.toml" --target-dir "$stage/crate" >/dev/null
cp "$stage/crate/package/hourglass-kafka-$version.crate" "$out/"

(cd "$out" && sha256sum -- * > SHA256SUMS)
echo "release $version ($commit) in $out:"
(cd "$out" && ls -l -- *)
