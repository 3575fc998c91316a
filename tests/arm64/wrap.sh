#!/usr/bin/env bash
# tests/arm64/wrap.sh ABUILD W: a mirror of the aarch64 build directory ABUILD
# under W in which every aarch64 executable is a script running it under
# qemu-aarch64-static (binfmt_misc need not be registered), and everything
# else (the fault shim, objects) is a symlink.  The test scripts then run
# unchanged with BUILD=W BIN=W/bin.
set -eu
ABUILD=$(cd "$1" && pwd); W=$2
QEMU=${QEMU:-qemu-aarch64-static}
# The libraries: Debian's arm64 packages through multiarch (tests/deps.sh arm64)
# install the arm64 libc and loader in /lib/aarch64-linux-gnu, so qemu needs no
# -L.  Not -L /usr/aarch64-linux-gnu: that loader (libc6-arm64-cross) with the
# multiarch libc.so.6 of another build hangs at the first thread.
[ -e /lib/ld-linux-aarch64.so.1 ] || { echo "arm64: /lib/ld-linux-aarch64.so.1 is missing: tests/deps.sh arm64"; exit 2; }
command -v "$QEMU" >/dev/null || { echo "arm64: $QEMU is missing: tests/deps.sh arm64"; exit 2; }
rm -rf "$W"
mkdir -p "$W"
W=$(cd "$W" && pwd)
cd "$ABUILD"
find . -path ./qemu -prune -o -path ./fmatrap -prune -o -type f \( -perm -u+x -o -name '*.so' \) -print | while read -r f; do
    mkdir -p "$W/$(dirname "$f")"
    if [ -x "$f" ] && [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && ! [[ $f == *.so ]]; then
        printf '#!/bin/sh\nexec %s %s "$@"\n' "$QEMU" "$ABUILD/${f#./}" > "$W/$f"
        chmod +x "$W/$f"
    else
        ln -s "$ABUILD/${f#./}" "$W/$f"
    fi
done
