# Sourced by the README's commands: installs the Debian packages genbridge needs when they are missing.
GB_DEBIAN_PACKAGES=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
                    nlohmann-json3-dev libfmt-dev libcli11-dev ccache libpcre2-dev libutf8proc-dev libhwy-dev)

# ccache: hits across the three builds and across clones (paths relative to the clone).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export CCACHE_NOHASHDIR=1

gb_install_deps() {
  local missing=()
  for p in "${GB_DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # node + npm run the text oracles (tests/text/oracle). Checked as commands: a Node.js from elsewhere
  # (e.g. a nodesource package, which conflicts with Debian's npm) is as good as Debian's.
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "== installing Debian packages: nodejs npm"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
  fi
}
