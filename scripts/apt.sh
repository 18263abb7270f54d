# Sourced by the project's scripts: `apt_install WHO PACKAGE...` installs Debian packages with apt-get (through
# sudo when not root), updating the package lists only when an install fails without them (a fresh machine).
apt_install() {
  local who=$1
  shift
  local apt=(apt-get)
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "$who: $* missing, and installing needs root" >&2; return 1; }
    apt=(sudo DEBIAN_FRONTEND=noninteractive apt-get)
  fi
  echo "$who: installing $* with apt-get"
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q "$@" >/dev/null; then
    "${apt[@]}" update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q "$@" >/dev/null
  fi
}
