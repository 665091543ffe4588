#!/usr/bin/env bash
# Builds llama.cpp once for both real model servers of the model tests: llama.cpp's own
# `llama-server` (which takes `json_schema` response formats) and the shared libraries that
# llama-cpp-python's server loads (`make model-server` installs its Python package without
# compiling and puts these libraries in it). One compile, from the llama.cpp source that
# llama-cpp-python's sdist vendors, at the version constraints-model.txt pins; before, each
# server compiled llama.cpp on its own (about 6 and 12 minutes on 2 cores).
#
# No network beyond PyPI (the source is pip's download of the sdist, which is kept beside the
# build for `make model-server`; no web UI is fetched). Kept in the user's cache, outside the
# clone (as pip's wheels are), so a later run or a fresh clone reuses it; about 8 minutes on
# 2 cores the first time.
#
#   tests/model/build-llama.sh PYTHON OUT_DIR
#     OUT_DIR/llama-server, OUT_DIR/lib*.so (their RUNPATH is $ORIGIN), and
#     OUT_DIR/llama_cpp_python-VERSION.tar.gz
set -euo pipefail
python=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^llama-cpp-python==//p' "$root/constraints-model.txt")
[ -n "$version" ] || { echo "no llama-cpp-python version in constraints-model.txt" >&2; exit 1; }
sdist=llama_cpp_python-$version.tar.gz
if [ -x "$out/llama-server" ] && [ -f "$out/$sdist" ]; then exit 0; fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/llama-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "building llama.cpp $version for both model servers (from llama-cpp-python's sdist; about 8 minutes on 2 cores)"
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work/$sdist" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# Shared libraries, as llama-cpp-python's own build makes them (BUILD_SHARED_LIBS, no curl),
# each finding the others beside it ($ORIGIN) wherever they are copied. C++ at -O1, C at
# Release's -O3: the model's arithmetic is ggml's C (and its intrinsics), and the rest (the
# server, its JSON and HTTP, the chat templates, the multimodal models) is template-heavy C++
# that compiles much faster at -O1: the whole build took 8:06 instead of 11:49 here, and the
# model tests took 3:04 either way.
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  '-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG' \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/cmake.log" 2>&1 ||
  { tail -40 "$work/cmake.log" >&2; exit 1; }
# llama-server links every library llama-cpp-python loads (llama, ggml*, mtmd).
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$out"
cp -P "$work/build/bin/"lib*.so* "$out/"
cp "$work/$sdist" "$out/$sdist.part"
mv "$out/$sdist.part" "$out/$sdist"
cp "$work/build/bin/llama-server" "$out/llama-server.part"
mv "$out/llama-server.part" "$out/llama-server"
"$out/llama-server" --version 2>&1 | head -2
