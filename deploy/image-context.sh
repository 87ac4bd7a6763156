#!/usr/bin/env bash
# Prepare the build context for deploy/Containerfile: OUT/rootfs with the devplug binary at
# /usr/bin/devplug and every shared library it loads (as ldd resolves them), at the same paths.
set -euo pipefail
out=${1:?usage: image-context.sh OUT [DEVPLUG_BINARY]}
bin=${2:-target/release/devplug}
rootfs="$out/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/usr/bin" "$rootfs/tmp"
install -m 0755 "$bin" "$rootfs/usr/bin/devplug"
# "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and "/lib64/ld-linux-x86-64.so.2 (0x…)"
ldd "$bin" | awk '/=> \//{print $3} /^[[:space:]]*\//{print $1}' | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
echo "$rootfs"
