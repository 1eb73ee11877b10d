#!/usr/bin/env bash
# Debian's HAProxy, the front of a VM's engines (components/front.py), for the tests and benchmarks/engine_front.py
# that run it on 127.0.0.1. Idempotent: nothing to do when haproxy is on PATH or in /usr/sbin (where Debian puts it).
# Installs with apt-get as root, or through sudo without a password; otherwise says how and leaves it to the user
# (tests/components/test_front.py then skips its `haproxy -c` check, and the e2e tier's front test fails naming the
# command).
set -euo pipefail

if command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "warning: haproxy is not installed and there is no apt-get here; install HAProxy 2.4 or later" >&2
  exit 0
fi
as_root=()
if [[ $(id -u) != 0 ]]; then
  if sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "warning: haproxy is not installed; sudo apt-get install -y haproxy" >&2
    exit 0
  fi
fi
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends haproxy >/dev/null
echo "installed $(/usr/sbin/haproxy -v | head -n 1)"
