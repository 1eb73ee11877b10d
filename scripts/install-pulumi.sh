#!/usr/bin/env bash
# Prints the directory of a Pulumi CLI this project can use, installing the pinned release when it must.
#
# A `pulumi` on PATH at or above the minimum is used as it is. Otherwise the version pinned in .pulumi-version (the
# pin CI's pulumi/actions reads too) is installed into .tools/pulumi/bin/ (git-ignored) and reused on later runs:
# the release archive for this OS and architecture is downloaded, checked against the release's published SHA-256
# checksums file before it is unpacked, unpacked into a staging directory, checked to report the pinned version,
# and only then renamed into place. A failed download or a checksum mismatch stops with one line on stderr and
# leaves nothing installed; a failed download's line also says that any recent enough pulumi on PATH will do.
#
# The minimum is the floor pyproject.toml puts on the pulumi SDK (`pulumi>=3.200`): Pulumi builds the CLI and its
# SDKs from one tag with one version number, and the Automation API defaults to "the CLI version matching the SDK
# version", so a CLI older than the SDK floor is older than any SDK this program runs with.
#
# Release layout (pulumi/pulumi .goreleaser.yml; URLs as listed in pulumi/docs data/versions.json):
#   https://get.pulumi.com/releases/sdk/pulumi-v3.X.Y-{linux,darwin}-{x64,arm64}.tar.gz (windows: .zip)
#   https://get.pulumi.com/releases/sdk/pulumi-3.X.Y-checksums.txt, lines "<sha256 hex>  <archive name>"
#   each tar.gz holds pulumi/pulumi, pulumi/pulumi-language-python, ... (no bin/ level on Linux and macOS)
# TPUSERVE_PULUMI_DOWNLOAD_URL replaces the base URL (a mirror, or a test server on 127.0.0.1).
# Usage: PATH="$(scripts/install-pulumi.sh):$PATH"
set -euo pipefail
cd "$(dirname "$0")/.."

base_url=${TPUSERVE_PULUMI_DOWNLOAD_URL:-https://get.pulumi.com/releases/sdk}
install_dir=$PWD/.tools/pulumi/bin

fail() {
  echo "install-pulumi: $*" >&2
  exit 1
}

pinned=$(tr -d '[:space:]' <.pulumi-version)
[[ $pinned =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail ".pulumi-version must hold one version such as 3.200.0, got '$pinned'"
minimum=$(sed -nE 's/^[[:space:]]*"pulumi>=([0-9]+\.[0-9]+(\.[0-9]+)?).*/\1/p' pyproject.toml | head -n 1)
[[ -n $minimum ]] || fail "pyproject.toml has no \"pulumi>=X.Y\" requirement to take the minimum CLI version from"
[[ $minimum == *.*.* ]] || minimum=$minimum.0

# "v3.200.1" (or "v3.200.1-alpha.x1f2e3d") -> "3.200.1"; empty when the output is not a version.
version_of() {
  local out
  out=$("$1" version 2>/dev/null) || return 0
  [[ $out =~ ^v?([0-9]+\.[0-9]+\.[0-9]+) ]] && echo "${BASH_REMATCH[1]}"
  return 0
}

# at_least A B: version A >= version B (both X.Y.Z).
at_least() {
  local -a a b
  IFS=. read -r -a a <<<"$1"
  IFS=. read -r -a b <<<"$2"
  local i
  for i in 0 1 2; do
    ((10#${a[i]} > 10#${b[i]})) && return 0
    ((10#${a[i]} < 10#${b[i]})) && return 1
  done
  return 0
}
at_least "$pinned" "$minimum" || fail ".pulumi-version pins $pinned, below the minimum $minimum (pyproject.toml)"

if found=$(command -v pulumi); then
  version=$(version_of "$found")
  if [[ -n $version ]] && at_least "$version" "$minimum"; then
    echo "install-pulumi: using pulumi v$version at $found" >&2
    dirname "$found"
    exit 0
  fi
  if [[ -n $version ]]; then
    echo "install-pulumi: pulumi at $found is v$version, older than the v$minimum this program needs;" \
      "using v$pinned from .tools/pulumi instead" >&2
  else
    echo "install-pulumi: pulumi at $found reports no version; using v$pinned from .tools/pulumi instead" >&2
  fi
fi

if [[ -x $install_dir/pulumi && $(version_of "$install_dir/pulumi") == "$pinned" ]]; then
  echo "install-pulumi: using pulumi v$pinned at ${install_dir#"$PWD"/}/pulumi" >&2
  echo "$install_dir"
  exit 0
fi

case $(uname -s) in
  Linux) os=linux ;;
  Darwin) os=darwin ;;
  *) fail "no Pulumi CLI for $(uname -s) here: install pulumi >= $minimum yourself (https://www.pulumi.com/docs/install/)" ;;
esac
case $(uname -m) in
  x86_64 | amd64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) fail "no Pulumi CLI for $(uname -m) machines: install pulumi >= $minimum yourself (https://www.pulumi.com/docs/install/)" ;;
esac
archive=pulumi-v$pinned-$os-$arch.tar.gz
checksums=pulumi-$pinned-checksums.txt

if command -v sha256sum >/dev/null; then
  sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null; then
  sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  fail "neither sha256sum nor shasum is installed: cannot verify the Pulumi CLI download"
fi

download=$(mktemp -d)
staging=
cleanup() {
  rm -rf "$download"
  [[ -z $staging ]] || rm -rf "$staging"
}
trap cleanup EXIT

fetch() {
  local err
  # --proto-redir: a redirect may never downgrade the download to plain http.
  if ! err=$(curl --fail --silent --show-error --location --proto-redir =https --retry 2 \
    --output "$download/$1" "$base_url/$1" 2>&1); then
    err=${err##*$'\n'} # curl prints its error once per try (--retry): the last one says it
    fail "could not download $base_url/$1 (${err#curl: }); nothing was installed. Any pulumi >= $minimum on PATH" \
      "works instead: install it (https://www.pulumi.com/docs/install/) or copy one from a machine that has it," \
      "then run this again; or point TPUSERVE_PULUMI_DOWNLOAD_URL at a mirror of https://get.pulumi.com/releases/sdk"
  fi
}

echo "install-pulumi: downloading pulumi v$pinned ($os-$arch) from $base_url" >&2
fetch "$checksums"
fetch "$archive"
# sha256sum's binary mode writes "<hash> *<name>"; GoReleaser writes "<hash>  <name>".
expected=$(awk -v name="$archive" '{ file = $2; sub(/^\*/, "", file) } file == name { print $1; exit }' \
  "$download/$checksums")
[[ -n $expected ]] || fail "$checksums lists no checksum for $archive; nothing was installed"
actual=$(sha256 "$download/$archive")
[[ $actual == "$expected" ]] ||
  fail "checksum mismatch for $archive (expected $expected, got $actual): refusing to install it; nothing was installed"

mkdir -p "$(dirname "$install_dir")"
staging=$(mktemp -d "$(dirname "$install_dir")/.staging.XXXXXX")
tar -xzf "$download/$archive" -C "$staging" || fail "could not unpack $archive; nothing was installed"
got=
[[ -x $staging/pulumi/pulumi ]] && got=$(version_of "$staging/pulumi/pulumi")
[[ $got == "$pinned" ]] ||
  fail "$archive does not hold pulumi/pulumi reporting v$pinned (got '${got}'); nothing was installed"

# Two renames on one filesystem: the old CLI stays whole until the new one, already complete, takes its place.
if [[ -e $install_dir ]]; then
  mv "$install_dir" "$staging/previous"
fi
mv "$staging/pulumi" "$install_dir"
echo "install-pulumi: installed pulumi v$pinned at ${install_dir#"$PWD"/}/pulumi" >&2
echo "$install_dir"
