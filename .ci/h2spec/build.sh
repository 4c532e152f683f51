#!/usr/bin/env bash
# Builds h2spec (the HTTP/2 conformance suite) for the agent's conformance
# test, with Debian's Go and Go libraries (no module download), from the
# h2spec source SRC and the driver beside this script (main.go).
# Usage: .ci/h2spec/build.sh SRC OUT_DIR   -> OUT_DIR/h2spec
set -euo pipefail
src="$(cd "${1:?usage: build.sh SRC OUT_DIR}" && pwd)"
out="${2:?usage: build.sh SRC OUT_DIR}"; mkdir -p "$out"; out="$(cd "$out" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
need="golang-go golang-golang-x-net-dev golang-github-spf13-cobra-dev golang-github-fatih-color-dev golang-github-mattn-go-colorable-dev golang-github-mattn-go-isatty-dev golang-github-spf13-pflag-dev"
if ! dpkg -s $need >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
gp="$(mktemp -d)"; trap 'rm -rf "$gp"' EXIT
pkg="$gp/src/github.com/summerwind/h2spec"
mkdir -p "$(dirname "$pkg")"; cp -r "$src" "$pkg"; chmod -R u+w "$pkg"
mkdir -p "$pkg/cmd/gov-h2spec"; cp "$here/main.go" "$pkg/cmd/gov-h2spec/main.go"
cd "$pkg"
GO111MODULE=off GOPATH="$gp:/usr/share/gocode" GOCACHE="$gp/cache" go build -o "$out/h2spec" ./cmd/gov-h2spec
echo "built $out/h2spec"
