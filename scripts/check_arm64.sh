#!/usr/bin/env bash
# ARM64 check (issue 26): run the torch-free runtime on an aarch64 Debian under user-mode
# emulation (qemu-user-static + binfmt_misc) and compare it with x86_64 ONNX Runtime and
# PyTorch. This script makes sure the machine can do it and builds (once) the root file
# system; scripts/check_arm64.py does the rest.   Usage: make check-arm64 [OUT=dir]
#
# Where the root file system cannot be built or run (not root, no debootstrap, no
# binfmt_misc, no aarch64 interpreter registered with the F flag) it says why and exits 3:
# it never passes without having run on aarch64.
#
# Settings (environment), for CI and for the tests of the refusal path:
#   VIT_DEPLOY_ARM64_ROOTFS      the root file system (default: a per-machine cache,
#                                ${XDG_CACHE_HOME:-$HOME/.cache}/vit-deploy/arm64-rootfs)
#   VIT_DEPLOY_ARM64_BINFMT      the binfmt_misc directory (default /proc/sys/fs/binfmt_misc)
#   VIT_DEPLOY_ARM64_TOOLS_PATH  where debootstrap and chroot are looked up ($PATH + sbin)
#   VIT_DEPLOY_ARM64_SUITE / _MIRROR   Debian release and mirror (bookworm, deb.debian.org)
set -euo pipefail
BIN=${BIN:-.venv/bin}
ROOTFS=${VIT_DEPLOY_ARM64_ROOTFS:-${XDG_CACHE_HOME:-$HOME/.cache}/vit-deploy/arm64-rootfs}
BINFMT_DEFAULT=/proc/sys/fs/binfmt_misc
BINFMT=${VIT_DEPLOY_ARM64_BINFMT:-$BINFMT_DEFAULT}
TOOLS_PATH=${VIT_DEPLOY_ARM64_TOOLS_PATH:-$PATH:/usr/sbin:/sbin}
SUITE=${VIT_DEPLOY_ARM64_SUITE:-bookworm}
MIRROR=${VIT_DEPLOY_ARM64_MIRROR:-http://deb.debian.org/debian}
STAMP=.vit-deploy-rootfs  # written last: a root file system without it is not finished

refuse() {
  echo "check-arm64: cannot run here: $1" >&2
  echo "check-arm64: nothing was run on aarch64; this is a failure, not a pass" >&2
  exit 3
}
tool() { PATH="$TOOLS_PATH" command -v "$1" 2>/dev/null; }

# --- can this machine run aarch64 binaries? ---------------------------------------------
[ "$(id -u)" = 0 ] || refuse "needs root (debootstrap and chroot); run as root, e.g. sudo make check-arm64"
# binfmt_misc: mount it where it is missing (only the real one, never a directory we were given)
if [ ! -e "$BINFMT/register" ] && [ "$BINFMT" = "$BINFMT_DEFAULT" ] && [ -d "$BINFMT" ]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null || true
fi
[ -e "$BINFMT/register" ] || refuse "binfmt_misc is not mounted at $BINFMT (mount -t binfmt_misc binfmt_misc $BINFMT_DEFAULT; in a container the host must allow it)"
# Debian's qemu-user-static registers qemu-aarch64 through binfmt-support; enable it if it is off
if [ ! -e "$BINFMT/qemu-aarch64" ] && [ "$BINFMT" = "$BINFMT_DEFAULT" ] && tool update-binfmts >/dev/null; then
  PATH="$TOOLS_PATH" update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
fi
ENTRY="$BINFMT/qemu-aarch64"
[ -e "$ENTRY" ] || refuse "no aarch64 interpreter is registered in $BINFMT (apt-get install qemu-user-static binfmt-support)"
grep -qx enabled "$ENTRY" || refuse "the aarch64 interpreter in $ENTRY is disabled (update-binfmts --enable qemu-aarch64)"
# F (fix binary): the kernel opens the interpreter at registration, so it runs inside a chroot
# that does not contain it. Debian's qemu-user-binfmt registers without F and needs
# qemu-user-static instead.
FLAGS=$(sed -n 's/^flags: *//p' "$ENTRY")
case "$FLAGS" in *F*) ;; *) refuse "the aarch64 interpreter is registered without the F flag (flags: '${FLAGS}'); install qemu-user-static (it replaces qemu-user-binfmt)";; esac
tool chroot >/dev/null || refuse "chroot is not on the tool path ($TOOLS_PATH)"

# --- the root file system: built once per machine, reused after -------------------------
if [ ! -e "$ROOTFS/$STAMP" ]; then
  tool debootstrap >/dev/null || refuse "no root file system at $ROOTFS and no debootstrap to build one (apt-get install debootstrap)"
  echo "check-arm64: building an aarch64 Debian $SUITE at $ROOTFS (12-15 min under emulation, once per machine)" >&2
  rm -rf "$ROOTFS.partial"
  mkdir -p "$(dirname "$ROOTFS")"
  start=$(date +%s)
  # a partial directory renamed when done: an interrupted build is never taken for a root
  # file system; /proc and /sys are not mounted inside (ONNX Runtime's CPU detection crashed
  # under emulation with them; without them it only warns)
  if ! nice -n 10 env PATH="$TOOLS_PATH:$PATH" debootstrap --arch=arm64 --variant=minbase \
      --include=python3,python3-venv,python3-pip "$SUITE" "$ROOTFS.partial" "$MIRROR" >&2; then
    echo "check-arm64: debootstrap failed; see $ROOTFS.partial/debootstrap/debootstrap.log" >&2
    exit 1
  fi
  rm -rf "$ROOTFS"
  mv "$ROOTFS.partial" "$ROOTFS"
  echo "suite=$SUITE built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" > "$ROOTFS/$STAMP"
fi
machine=$(PATH="$TOOLS_PATH" chroot "$ROOTFS" /usr/bin/uname -m 2>&1) || \
  refuse "the root file system at $ROOTFS does not run: $machine"
[ "$machine" = aarch64 ] || refuse "the root file system at $ROOTFS runs as '$machine', not aarch64"
echo "check-arm64: aarch64 root file system at $ROOTFS ($(cat "$ROOTFS/$STAMP"))" >&2

exec env PATH="$TOOLS_PATH:$PATH" "$BIN/python" scripts/check_arm64.py --rootfs "$ROOTFS" "$@"
