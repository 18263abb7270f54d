# Sourced by the project's scripts: `apt_install WHO PACKAGE...` installs Debian packages with apt-get (through
# sudo when not root), updating the package lists only when an install fails without them (a fresh machine). Two
# scripts may install at once (the test command's builds run side by side): apt-get waits for the other's lock.
apt_install() {
  local who=$1
  shift
  local apt=(apt-get -o DPkg::Lock::Timeout=600)
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "$who: $* missing, and installing needs root" >&2; return 1; }
    apt=(sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
  fi
  echo "$who: installing $* with apt-get"
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q "$@" >/dev/null; then
    "${apt[@]}" update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q "$@" >/dev/null
  fi
}
