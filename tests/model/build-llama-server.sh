#!/usr/bin/env bash
# Builds llama.cpp's own server, `llama-server`, from the llama.cpp source that llama-cpp-python
# vendors, at the version constraints-model.txt pins: the server that takes `json_schema`
# response formats, for the model tests' json_schema path. No network beyond PyPI (the source
# is pip's download of the sdist; no web UI is fetched). The binary is kept in the user's cache
# (outside the clone, as pip's wheels are), so a later run or a fresh clone reuses it; about
# 10 minutes on 2 cores the first time.
#
#   tests/model/build-llama-server.sh PIP OUT_DIR     # OUT_DIR/llama-server when done
set -euo pipefail
pip=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^llama-cpp-python==//p' "$root/constraints-model.txt")
[ -n "$version" ] || { echo "no llama-cpp-python version in constraints-model.txt" >&2; exit 1; }
if [ -x "$out/llama-server" ]; then exit 0; fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "building llama.cpp's llama-server $version (from llama-cpp-python's sdist; about 10 minutes on 2 cores)"
"$pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$work/cmake.log" 2>&1 ||
  { tail -40 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$out"
cp "$work/build/bin/llama-server" "$out/llama-server.part"
mv "$out/llama-server.part" "$out/llama-server"
"$out/llama-server" --version 2>&1 | head -2
