#!/usr/bin/env bash
# The Debian package, end to end (CI: .ci/run, as root on Debian 12; not `make test`, which
# covers make install): build it with dpkg-buildpackage -b -us -uc (in a copy of the tree:
# `debian/rules clean` would remove this build's bin/ and build/), lintian with no error (and a
# broken package seen to get a tag, so lintian is known to run), dpkg -i, the installed kpack
# and krun (--help, --version, the manual pages, completion, the user krun), the demo model end
# to end with the installed tools, krun-serve@.service under systemd (tests/pkg/systemd_boot.sh),
# then dpkg -r and dpkg --purge: nothing of the package left.  Ends with "N passed, N failed".
#   tests/pkg/deb.sh            (needs bin/k3synth, the synthesizer of the demo: make all)
set -u
cd "$(dirname "$0")/../.."
TOP=$PWD
PASS=0 FAILS=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
notok() { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
skip() { echo "skip - $*"; }
summary() { echo "$PASS passed, $FAILS failed"; [ "$FAILS" -eq 0 ]; }
if [ "$(id -u)" -ne 0 ]; then skip "the Debian package (dpkg -i needs root)"; summary; exit; fi
for t in dpkg-buildpackage dh lintian; do
    command -v $t >/dev/null || { notok "$t is missing: tests/deps.sh pkg"; summary; exit; }
done
if dpkg-query -W -f='${Status}' kpk 2>/dev/null | grep -q 'ok installed'; then
    notok "kpk is installed on this machine already: dpkg --purge kpk first"; summary; exit
fi
[ -x bin/k3synth ] || make -s all >/dev/null || { notok "make all (bin/k3synth)"; summary; exit; }

W=$(mktemp -d /tmp/kpk-deb.XXXXXX)
INSTALLED=
trap '[ -n "$INSTALLED" ] && dpkg --purge kpk >/dev/null 2>&1; rm -rf "$W"' EXIT
ver=$(sed -n '1s/^kpk (\([^)]*\)).*/\1/p' debian/changelog)
arch=$(dpkg --print-architecture)
S="$W/kpk-$ver"
mkdir -p "$S"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$S"
t0=$(date +%s)
if (cd "$S" && dpkg-buildpackage -b -us -uc -j"$(nproc)") > "$W/build.log" 2>&1 && [ -f "$W/kpk_${ver}_$arch.deb" ]; then
    ok "dpkg-buildpackage -b -us -uc: kpk_${ver}_$arch.deb ($(($(date +%s) - t0)) s; the build ran the demo model)"
else
    notok "dpkg-buildpackage: $(tail -15 "$W/build.log" | tr '\n' ' ')"; summary; exit
fi
DEB="$W/kpk_${ver}_$arch.deb"
dpkg-deb -f "$DEB" Depends | grep -q 'libmicrohttpd' && ok "Depends from the shared libraries: $(dpkg-deb -f "$DEB" Depends)" \
    || notok "Depends: $(dpkg-deb -f "$DEB" Depends)"

# lintian: no error; and it is alive: a copy without krun's manual page gets no-manual-page
lintian --fail-on error --display-info "$W/kpk_${ver}_$arch.changes" > "$W/lintian.out" 2>&1
rc=$?
sed 's/^/# lintian: /' "$W/lintian.out" | grep -v 'running with root' | head -40
if [ $rc -eq 0 ] && ! grep -q '^E:' "$W/lintian.out"; then
    ok "lintian: no error ($(grep -c '^W:' "$W/lintian.out") warnings, $(grep -c '^I:' "$W/lintian.out") informational tags)"
else
    notok "lintian: exit $rc, $(grep -c '^E:' "$W/lintian.out") errors"
fi
dpkg-deb -R "$DEB" "$W/broken" && rm "$W/broken/usr/share/man/man1/krun.1.gz" && sed -i '/krun\.1\.gz/d' "$W/broken/DEBIAN/md5sums" \
    && dpkg-deb -b "$W/broken" "$W/broken.deb" >/dev/null && lintian "$W/broken.deb" 2>/dev/null | grep -q 'no-manual-page.*usr/bin/krun' \
    && ok "lintian runs its checks: a copy without krun.1 gets no-manual-page" || notok "lintian did not flag a package without krun.1"

# install
if dpkg -i "$DEB" > "$W/install.log" 2>&1; then
    INSTALLED=1
    ok "dpkg -i kpk_${ver}_$arch.deb"
else
    notok "dpkg -i: $(tail -5 "$W/install.log" | tr '\n' ' ')"; summary; exit
fi
dpkg -L kpk | sort > "$W/files"
[ "$(command -v kpack)" = /usr/bin/kpack ] && [ "$(command -v krun)" = /usr/bin/krun ] && kpack --help >/dev/null && krun --help >/dev/null \
    && krun serve --help >/dev/null && ok "kpack --help, krun --help, krun serve --help from /usr/bin" || notok "the installed --help"
[ "$(kpack --version | head -1)" = "kpack $ver" ] && [ "$(krun --version | head -1)" = "krun $ver" ] \
    && ok "kpack --version and krun --version: $ver, the package's version" || notok "--version: $(kpack --version | head -1), $(krun --version | head -1)"
# man -l: rendered as man would, without leaving formatted copies in man-db's cache
err=$(MANWIDTH=80 man -l "$(man -w krun)" 2>&1 >"$W/krun.txt"); err2=$(MANWIDTH=80 man -l "$(man -w kpack)" 2>&1 >/dev/null)
[ "$(man -w krun)" = /usr/share/man/man1/krun.1.gz ] && [ -z "$err$err2" ] && grep -q 'krun-serve@' "$W/krun.txt" \
    && ok "man krun, man kpack: installed and rendered without a warning" || notok "man: $(man -w krun 2>&1) $err $err2"
got=$(bash -c 'source /usr/share/bash-completion/completions/krun; COMP_WORDS=(krun serve --max-conn); COMP_CWORD=2; _kpk_complete; echo "${COMPREPLY[*]}"')
[ "$got" = "--max-connections --max-connections-per-ip" ] && ok "the installed completion: krun serve --max-conn<TAB> -> $got" \
    || notok "installed completion: '$got'"
pw=$(getent passwd krun)
[ -n "$pw" ] && [ "$(cut -d: -f3 <<<"$pw")" -lt 1000 ] && [ "$(cut -d: -f7 <<<"$pw")" = /usr/sbin/nologin ] \
    && ok "the postinst made the system user krun ($pw) through systemd-sysusers" || notok "user krun: '$pw'"

# the demo model end to end with the installed tools (k3synth, a test tool, from the build)
if DEMO_DIR="$W/demo" KPK_BIN=/usr/bin K3SYNTH="$TOP/bin/k3synth" tests/demo.sh > "$W/demo.log" 2>&1; then
    ok "the demo with /usr/bin/kpack and /usr/bin/krun: check-source, convert, verify, info, generate"
else
    notok "demo: $(tail -5 "$W/demo.log" | tr '\n' ' ')"
fi

# the service, under systemd
bash tests/pkg/systemd_boot.sh "$W/demo/tiny.kpk" > "$W/boot.out" 2>&1
cat "$W/boot.out"
PASS=$((PASS + $(grep -c '^ok ' "$W/boot.out"))); FAILS=$((FAILS + $(grep -c '^not ok ' "$W/boot.out")))

# remove, purge: nothing left (the user krun stays, as Debian leaves system users)
mkdir -p /var/cache/krun/leftover && touch /var/cache/krun/leftover/state   # what a service run leaves
touch "$W/stamp"
dpkg -r kpk > "$W/remove.log" 2>&1 || notok "dpkg -r: $(tail -3 "$W/remove.log")"
left=$(while read -r f; do [ ! -d "$f" ] && [ -e "$f" -o -L "$f" ] && echo "$f"; done < "$W/files")
[ -z "$left" ] && ok "dpkg -r: none of the package's $(wc -l < "$W/files") paths is a file any more" || notok "after dpkg -r: $left"
dpkg --purge kpk > "$W/purge.log" 2>&1 || notok "dpkg --purge: $(tail -3 "$W/purge.log")"
INSTALLED=
gone=1
for d in /etc/krun /var/cache/krun /usr/share/doc/kpk /usr/bin/krun /lib/systemd/system/krun-serve@.service /usr/lib/sysusers.d/krun.conf; do
    [ -e "$d" ] && { notok "left after purge: $d"; gone=; }
done
stray=$(find /etc /usr /lib /var /opt /srv -xdev \( -name '*krun*' -o -name '*kpack*' -o -name 'kpk' -o -name 'kpk_*' \) \
    ! -path '/var/lib/dpkg/*' ! -path '/var/cache/man/*' ! -path "$W/*" 2>/dev/null | head -5)
if [ -n "$gone" ] && [ -z "$stray" ] && ! dpkg-query -W kpk >/dev/null 2>&1; then
    ok "dpkg --purge: the package, /etc/krun, /var/cache/krun and every file are gone; no path named krun, kpack or kpk under /etc /usr /lib /var /opt /srv (the user krun stays, as Debian leaves system users)"
else
    notok "after purge: $stray"
fi
summary
