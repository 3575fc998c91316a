#!/usr/bin/env bash
# Installs the Debian packages the build and tests need (`make deps`).
# As root it runs apt-get; otherwise it prints the command to run.
#   tests/deps.sh fuzz   what `make fuzz` needs besides: clang and libFuzzer
#                        (libclang-rt-14-dev); `make test` does not need them.
#   tests/deps.sh pkg    what tests/pkg/deb.sh (CI) needs besides: the Debian packaging tools,
#                        lintian, and systemd-nspawn to run krun-serve@.service under systemd.
#   tests/deps.sh arm64  what `make CROSS=aarch64-linux-gnu-` and `make test-arm64`
#                        need besides: Debian's aarch64 cross compiler, the arm64
#                        -dev packages through multiarch (adds the arm64
#                        architecture to dpkg once) and qemu-user-static.
set -eu
# zstd: the command line tool; tests/ref/kpk.py codes and decodes zstd frames with it
# strace: test_save_pair injects ENOSPC at the system call, where stdio's own writes are
PKGS="build-essential clang pkg-config bc libzstd-dev libxxhash-dev libssl-dev libjansson-dev libpcre2-dev libmicrohttpd-dev python3-numpy zstd strace"
# mandoc: test_man.sh lints the manual pages with it (groff's warnings otherwise)
PKGS="$PKGS mandoc"
# chromium: krun serve's page is tested in it, headless (test_krun_serve_page.sh, through puppeteer-core from tests/node)
PKGS="$PKGS chromium"
# Open MPI: krun over several machines (run/cluster); test_krun_cluster runs mpirun on localhost
PKGS="$PKGS libopenmpi-dev openmpi-bin"
# python3-torch: tests/train (the drafter trained for issue 30; test_train.sh, make bench); the
# tests that use it skip visibly without it
PKGS="$PKGS python3-torch"
[ "${1:-}" = fuzz ] && PKGS="clang libclang-rt-14-dev"
[ "${1:-}" = pkg ] && PKGS="dpkg-dev debhelper fakeroot lintian systemd systemd-container curl man-db"
if [ "${1:-}" = arm64 ]; then
    PKGS="gcc-aarch64-linux-gnu qemu-user-static"
    for p in libzstd-dev libxxhash-dev libssl-dev libjansson-dev libpcre2-dev libmicrohttpd-dev; do PKGS="$PKGS $p:arm64"; done
fi
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && { echo "deps: all present"; exit 0; }
if [ "$(id -u)" -eq 0 ]; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    # multiarch: the arm64 libraries install beside the amd64 ones (once)
    if [ "${1:-}" = arm64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
    apt-get update -qq
    apt-get install -y -qq $missing
else
    echo "deps: missing$missing"
    [ "${1:-}" = arm64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64 && echo "deps: run as root:  dpkg --add-architecture arm64 && apt-get update"
    echo "deps: run as root:  apt-get install -y$missing"
    exit 1
fi
