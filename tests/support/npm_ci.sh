#!/usr/bin/env bash
# Usage: npm_ci.sh DIR LABEL. Installs DIR's npm packages (exact versions from DIR/package-lock.json) into
# DIR/node_modules, once per lock-file content: `npm ci --no-audit --no-fund`, serialised with flock so that
# concurrent ctest runs share one install. Fails, naming what to install, when node or npm is missing.
set -euo pipefail
here=$(cd "$1" && pwd)
label=$2
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$label: '$tool' not found: install Node.js 18 or newer with npm (Debian: apt-get install nodejs npm;" \
         "scripts/deps.sh installs it)" >&2
    exit 1
  fi
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
  echo "$label: node $(node --version) is too old: Node.js 18 or newer is needed" >&2
  exit 1
fi
cd "$here"
exec 9>"$here/.install.lock"
flock -w 900 9 || { echo "$label: another npm install held $here/.install.lock for 900 s" >&2; exit 1; }
stamp=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f node_modules/.genbridge-stamp ] && [ "$(cat node_modules/.genbridge-stamp)" = "$stamp" ]; then
  echo "$label: node_modules up to date (package-lock.json $stamp)"
  exit 0
fi
npm ci --no-audit --no-fund
echo "$stamp" > node_modules/.genbridge-stamp
echo "$label: installed $(node -p 'Object.keys(require("./package.json").dependencies).join(", ")')"
