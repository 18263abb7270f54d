# Sourced by the scripts that build Go programs for the tests (controlplane.sh, helm.sh, prometheus.sh).
#
# The newest Kubernetes' module (hack/k8s/<newest>/go.mod) also requires helm and Prometheus, so the three resolve
# one version of every dependency they share. Go's build cache keys a compiled package by its source, its
# dependencies and the compiler's flags, so with the same flags everywhere (go_build below) a package they share
# compiles once, whichever of them is built first, and the others only compile what is theirs.

# newest_module: the directory of the newest Kubernetes' module, hack/k8s/<version> (run from the repository root).
newest_module() {
  printf '%s\n' hack/k8s/*/ | sed 's:/$::' | sort -V | tail -n1
}

# module_time DIR MODULE FORMAT: MODULE's publication time in Go's time FORMAT, the build date the binaries report
# (so two builds of one version are identical).
module_time() {
  (cd "$1" && go list -m -f "{{.Time.UTC.Format \"$3\"}}" "$2")
}

# go_build DIR OUT LDFLAGS PACKAGE...: builds PACKAGEs of DIR's module into the directory OUT, statically, without
# paths or DWARF (less work on a 2-core runner; the link strips it anyway with -s -w). Prometheus' build tags drop
# every service discovery but file, http and Kubernetes (Debian's Prometheus has no Kubernetes discovery, which
# tests/cluster/test_prometheus.py needs); the tags name nothing in the other programs, and they are passed to
# every build so that all compile the same way.
go_build() {
  local dir=$1 out=$2 ldflags=$3
  shift 3
  command -v go >/dev/null || { echo "go_build: Go is needed to build $*" >&2; return 1; }
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags="$ldflags" -o "$out/" "$@")
}

# module_stamp DIR: what the binaries built from DIR's module depend on besides their own version (the module
# graph and Go itself), as one line. A build writes it beside its binaries (.module); binaries whose stamp differs
# are built again, so an edit of go.mod or go.sum, or another Go, never leaves stale binaries in the cache.
module_stamp() {
  echo "$(cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -d' ' -f1) $(go env GOVERSION 2>/dev/null || echo no-go)"
}

# stamped DIR STAMP: whether the binaries in DIR were built with STAMP.
stamped() {
  [ -f "$1/.module" ] && [ "$(cat "$1/.module")" = "$2" ]
}

# tool_built DIR BINARY...: whether the cache directory DIR holds each BINARY, built from the newest Kubernetes'
# module as it is now.
tool_built() {
  local dir=$1 name
  shift
  stamped "$dir" "$(module_stamp "$(newest_module)")" || return 1
  for name in "$@"; do [ -x "$dir/$name" ] || return 1; done
}

# build_tool WHO WHAT DIR LDFLAGS PACKAGE...: builds PACKAGEs of the newest Kubernetes' module (go_build) into the
# cache directory DIR, stamped. The build goes to a temporary directory renamed into place, so an interrupted one
# leaves nothing that looks finished.
build_tool() {
  local who=$1 what=$2 dir=$3 ldflags=$4 module tmp start
  shift 4
  module=$(newest_module)
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$dir.build.XXXXXX")
  # shellcheck disable=SC2064  # the directory is known now
  trap "rm -rf -- '$tmp'" EXIT
  trap 'exit 130' INT TERM  # so that the EXIT trap runs when interrupted
  start=$(date +%s)
  echo "$who: building $what from $module with $(go version | cut -d' ' -f3)"
  go_build "$module" "$tmp" "$ldflags" "$@"
  module_stamp "$module" >"$tmp/.module"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT INT TERM
  echo "$who: built in $(( $(date +%s) - start ))s"
}
