# Sourced by the README's commands: installs the Debian packages genbridge needs when they are missing.
GB_DEBIAN_PACKAGES=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
                    nlohmann-json3-dev libfmt-dev libcli11-dev ccache libpcre2-dev libutf8proc-dev libhwy-dev
                    libcpp-httplib-dev curl iproute2)
# The aarch64 cross build of scripts/test.sh (x86-64 hosts only): Debian's cross compiler, qemu-user to run
# its tests, and the arm64 (multiarch) dev packages of what the library, the CLI and the op tests link.
GB_AARCH64_PACKAGES=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64
                     libfmt-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libcpp-httplib-dev:arm64)

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
  if [ "$(uname -m)" = x86_64 ] && [ "${GENBRIDGE_SKIP_AARCH64:-0}" != 1 ]; then
    gb_install_aarch64_deps
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

# Adds the arm64 architecture to dpkg (multiarch) when missing, then installs GB_AARCH64_PACKAGES.
gb_install_aarch64_deps() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  local missing=() update=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "== dpkg --add-architecture arm64 (for the aarch64 cross build's dev packages)"
    $sudo dpkg --add-architecture arm64
    update=1
  fi
  for p in "${GB_AARCH64_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    update=1
  fi
  if [ $update -eq 1 ]; then
    $sudo apt-get update -qq
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# What both test scripts start with: the dependencies, the build and ctest parallelism (GB_JOBS,
# GB_TEST_JOBS from GENBRIDGE_JOBS / GENBRIDGE_TEST_JOBS, default nproc) and the environment the MPI
# tests need (Open MPI as root, oversubscribed, on loopback only).
gb_prepare_tests() {
  gb_install_deps
  GB_JOBS=${GENBRIDGE_JOBS:-$(nproc)}
  GB_TEST_JOBS=${GENBRIDGE_TEST_JOBS:-$GB_JOBS}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
}
