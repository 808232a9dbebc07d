#!/usr/bin/env bash
# Generates the Python protobuf and gRPC modules of kvbroker with Debian's
# protoc and grpc_python_plugin, into the package tree under OUT:
#   OUT/kvbroker/v1/kvbroker_pb2.py, kvbroker_pb2_grpc.py   (kvbroker.v1)
#   OUT/kvbroker/_googleapis/status_pb2.py, error_details_pb2.py
#                                                           (google.rpc)
# Nothing generated is committed. Bazel runs this from //py:generated; by
# hand, `py/generate.sh` (no arguments) writes next to the hand-written
# modules in py/, so that PYTHONPATH=py imports the whole package.
#
# Usage: py/generate.sh [PROTO_DIR OUT]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
proto_dir=${1:-$here/../proto}
out=${2:-$here}
protoc=/usr/bin/protoc
plugin=/usr/bin/grpc_python_plugin

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT

# kvbroker.v1 keeps its proto path, so the plugin's absolute import
# "from kvbroker.v1 import kvbroker_pb2" resolves inside this package.
"$protoc" -I"$proto_dir" -I/usr/include \
  --python_out="$staging" \
  --plugin=protoc-gen-grpc_python="$plugin" --grpc_python_out="$staging" \
  "$proto_dir/kvbroker/v1/kvbroker.proto"
# google.rpc keeps its proto file names ("google/rpc/status.proto"), as
# every other copy of these messages does; only the Python module moves, to
# a private subpackage, so it never shadows an installed google.rpc.
"$protoc" -I"$proto_dir" -I/usr/include --python_out="$staging" \
  "$proto_dir/google/rpc/status.proto" \
  "$proto_dir/google/rpc/error_details.proto"

mkdir -p "$out/kvbroker/v1" "$out/kvbroker/_googleapis"
cp "$staging/kvbroker/v1/kvbroker_pb2.py" \
  "$staging/kvbroker/v1/kvbroker_pb2_grpc.py" "$out/kvbroker/v1/"
cp "$staging/google/rpc/status_pb2.py" \
  "$staging/google/rpc/error_details_pb2.py" "$out/kvbroker/_googleapis/"
echo '"""kvbroker.v1 messages and service stubs (generated)."""' \
  >"$out/kvbroker/v1/__init__.py"
echo '"""google.rpc.Status and its standard details (generated)."""' \
  >"$out/kvbroker/_googleapis/__init__.py"
