# Sourced by tests/servers/*-start.sh after they define `fail`: what every start script shares.
#
# - An ERR trap, so an unguarded command that fails is reported by name and line (through the script's
#   own `fail`, which prints the export line the tests read) instead of ending the script silently.
# - need_packages PKG...: installs the Debian packages that are missing, as root or through sudo, and
#   says plainly when it can do neither.

trap 'fail "line $LINENO: \`$BASH_COMMAND\` exited $?"' ERR

need_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || fail "Debian packages ${missing[*]} are missing and apt-get is not available"
  local as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null \
      || fail "Debian packages ${missing[*]} are missing; installing them needs root (run as root, give this user passwordless sudo, or install them: apt-get install ${missing[*]})"
    as_root=(sudo -n)
  fi
  echo "installing ${missing[*]}" >&2
  "${as_root[@]}" apt-get update -qq >&2 || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || fail "apt-get install ${missing[*]} failed"
}
