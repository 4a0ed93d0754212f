#!/usr/bin/env bash
# The Debian packages agentmesh needs on the host, installed when they are missing:
#   bubblewrap   the local sandbox every command tool runs in (`bwrap`)
#   libseccomp2  the jail's syscall filter (found the way pyseccomp looks for it)
#   slirp4netns  the user-mode network of a sandbox template with `network: egress`
#   iproute2     `ip`, which keeps such a sandbox's routes to the host and private ranges closed
#   python3-numpy python3-pandas python3-matplotlib
#                what a local sandbox's Python (the system's python3) loads tables and draws figures with
# As root, or with passwordless sudo, it installs them with apt-get; otherwise it stops with
# the one command that does. `make install` and `.ci/run` call it.
#
#   scripts/system-packages.sh [PYTHON]      # PYTHON: the interpreter to find libseccomp with
set -euo pipefail

python="${1:-python3}"
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
# The jail runs the first python3 on its PATH (services/tools/sandbox/local.py: SANDBOX_PATH).
jail_python=$(PATH=/usr/local/bin:/usr/bin:/bin command -v python3 || true)
if [ -z "$jail_python" ] || ! "$jail_python" -c "import numpy, pandas, matplotlib" 2>/dev/null; then
  missing+=(python3-numpy python3-pandas python3-matplotlib)
fi
"$python" -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('seccomp') is None)" \
  || missing+=(libseccomp2)
[ ${#missing[@]} -eq 0 ] && exit 0

packages="${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "agentmesh needs the system packages: $packages (the sandbox for command tools)." >&2
  echo "Install them with this command, then run \`make install\` again:" >&2
  echo "" >&2
  echo "    sudo apt-get install -y $packages" >&2
  echo "" >&2
  echo "(not Debian/Ubuntu? install bubblewrap and libseccomp with your package manager)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "agentmesh needs the system packages: $packages, and this machine has no apt-get." >&2
  echo "Install bubblewrap and libseccomp with your package manager, then run \`make install\` again." >&2
  exit 1
fi
echo "installing the system packages agentmesh needs: $packages"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
