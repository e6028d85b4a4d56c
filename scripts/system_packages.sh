#!/usr/bin/env bash
# Debian packages a make target needs, installed where apt-get is usable as root.
#   Usage: scripts/system_packages.sh WHAT COMMAND:PACKAGE...
# A COMMAND found on $PATH (or in /usr/sbin, /sbin) means its PACKAGE is there; the missing
# packages are installed in one apt-get call. Where that cannot be done (not root, no
# apt-get) it says what is missing and exits 0: the targets that need them then fail with
# their own message (never skip).
set -euo pipefail
what=$1; shift
missing=()
for pair in "$@"; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "$what: installing Debian packages: ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "warning: $what needs ${missing[*]}, which cannot be installed here (apt-get as root);" \
    "what needs them will fail" >&2
fi
