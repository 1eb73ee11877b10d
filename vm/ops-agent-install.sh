#!/bin/bash
# ops-agent-install.sh CONFIG_YAML: install the Ops Agent when missing (Google's add-google-cloud-ops-agent-repo.sh),
# configure it, restart it on a change. Exit 1 (why on stderr): the supervisor's warning. Tests set OPS_AGENT_*.
set -Eeuo pipefail
# The caller may run with umask 077; apt's unprivileged _apt user must read the repository and keyring files.
umask 022

readonly CONFIG=${1:?usage: ops-agent-install.sh CONFIG_YAML}
readonly REPO_SCRIPT_URL=${OPS_AGENT_REPO_SCRIPT_URL:-https://dl.google.com/cloudagents/add-google-cloud-ops-agent-repo.sh}
readonly CONFIG_PATH=${OPS_AGENT_CONFIG_PATH:-/etc/google-cloud-ops-agent/config.yaml}
readonly ATTEMPTS=${OPS_AGENT_ATTEMPTS:-5}
readonly RETRY_DELAY_S=${OPS_AGENT_RETRY_DELAY_S:-10}
readonly PACKAGE=google-cloud-ops-agent
readonly SERVICE=google-cloud-ops-agent
export DEBIAN_FRONTEND=noninteractive

say() {
  printf '%s ops-agent: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

# retry COMMAND...: runs COMMAND up to ATTEMPTS times, doubling the delay between attempts.
retry() {
  local n=1 delay=$RETRY_DELAY_S
  until "$@"; do
    ((n < ATTEMPTS)) || return 1
    say "attempt $n/$ATTEMPTS of '$1' failed; retrying in ${delay}s"
    sleep "$delay"
    n=$((n + 1))
    delay=$((delay * 2))
  done
}

installed() {
  [[ $(dpkg-query -W -f='${Status}' "$PACKAGE" 2>/dev/null) == "install ok installed" ]]
}

install_agent() {
  local workdir status=0
  workdir=$(mktemp -d)
  if ! retry curl -fsSL -m 60 -o "$workdir/add-repo.sh" "$REPO_SCRIPT_URL"; then
    say "could not download $REPO_SCRIPT_URL after $ATTEMPTS attempts"
    status=1
  # apt must not read the caller's stdin.
  elif ! retry bash "$workdir/add-repo.sh" --also-install </dev/null; then
    say "add-google-cloud-ops-agent-repo.sh --also-install failed $ATTEMPTS times"
    status=1
  elif ! installed; then
    say "$PACKAGE is still not installed"
    status=1
  fi
  rm -rf "$workdir"
  return "$status"
}

config_current() {
  # Both sides through $(...), which drops trailing newlines alike.
  [[ -f $CONFIG_PATH ]] && [[ $(<"$CONFIG_PATH") == "$(printf '%s' "$CONFIG")" ]]
}

# CONFIG at CONFIG_PATH, atomically, readable by all (it holds no secret).
write_config() {
  mkdir -p "$(dirname "$CONFIG_PATH")" \
    && printf '%s' "$CONFIG" >"$CONFIG_PATH.tmp" \
    && chmod 0644 "$CONFIG_PATH.tmp" \
    && mv -f "$CONFIG_PATH.tmp" "$CONFIG_PATH"
}

main() {
  local changed=false
  if installed; then
    say "$PACKAGE already installed"
  else
    say "installing $PACKAGE"
    install_agent || return 1
  fi
  if ! config_current; then
    write_config || { say "could not write $CONFIG_PATH"; return 1; }
    changed=true
  fi
  if $changed || ! systemctl is-active --quiet "$SERVICE"; then
    say "configuration in $CONFIG_PATH; restarting $SERVICE"
    retry systemctl restart "$SERVICE" || { say "could not restart $SERVICE"; return 1; }
  else
    say "configuration unchanged and $SERVICE active"
  fi
  say "shipping vLLM metrics and container logs"
}

main
