#!/usr/bin/env bash
# Install the Debian packages the suite needs, only when they are missing.
#   Vulkan loader + Mesa lavapipe (CPU Vulkan device), glslang (GLSL -> SPIR-V),
#   the Khronos validation layer, and Chromium for the browser test.
#   PostgreSQL for the DuckLake catalog tests.
# Usage: scripts/apt-deps.sh [vulkan] [browser] [postgres]
set -euo pipefail
want=()
for group in "$@"; do
  case "$group" in
    vulkan) want+=(libvulkan1 mesa-vulkan-drivers glslang-tools vulkan-validationlayers) ;;
    browser) want+=(chromium) ;;
    postgres) want+=(postgresql postgresql-common) ;;
    *) echo "apt-deps: unknown group '$group' (expected: vulkan, browser, postgres)" >&2; exit 2 ;;
  esac
done
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
echo "apt-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
