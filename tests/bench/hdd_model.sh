# shellcheck shell=bash
# The HDD model (sourced, not run; root only): N "drives", each a loop device
# over a file on this machine's disk, with its own ext4 file system, read and
# write throttled to HDD_MBPS MiB/s by a block-I/O cgroup.  Commands run with
# hdd_exec are in that cgroup, so every byte they move to or from a drive is
# paced like a spinning disk's sequential transfer.
#
# What it models: sequential bandwidth per drive, independently per drive.
# What it does not: seeks and rotational latency (an IOPS cap would model
# nothing real: the kernel splits a large request into many bios, and 200
# IOPS turned 8 MiB reads into 75 MB/s).  Keep N x HDD_MBPS well below the
# backing disk's own speed (1.3-2.4 GB/s here), or the model measures the
# backing disk.  The loop devices use direct I/O on their backing files, so
# the backing file system's page cache does not hide the drives.
#
#   hdd_up N SIZE_GIB      create and mount N drives under $HDD_ROOT/d0 .. d(N-1)
#   hdd_exec CMD...        run CMD inside the throttled cgroup
#   hdd_drop               sync and drop the page cache (reads then hit the drives)
#   hdd_stats              "drive bytes_read" for every drive since the last hdd_reset
#   hdd_reset              zero the per-drive counters
#   hdd_down               unmount, detach, delete (also run on exit by the caller's trap)
#
# cgroup v1 (blkio.throttle.*_bps_device) here; cgroup v2 (io.max) elsewhere.

HDD_MBPS=${HDD_MBPS:-250}
HDD_ROOT=${HDD_ROOT:-/var/tmp/kpk-hdd}
HDD_CG_NAME=kpk-hdd-$$
HDD_DEVS=()
HDD_MAJMIN=()
HDD_CG=""
HDD_CGV=0

hdd_die() { echo "hdd_model: $*" >&2; return 1; }

hdd_cgroup_init() {
    if [ -d /sys/fs/cgroup/blkio ] && [ -w /sys/fs/cgroup/blkio ]; then
        HDD_CG=/sys/fs/cgroup/blkio/$HDD_CG_NAME; HDD_CGV=1
    elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
        HDD_CG=/sys/fs/cgroup/$HDD_CG_NAME; HDD_CGV=2
        grep -qw io /sys/fs/cgroup/cgroup.subtree_control || echo +io > /sys/fs/cgroup/cgroup.subtree_control
    else
        hdd_die "no block-I/O cgroup controller (v1 blkio or v2 io) is writable"; return 1
    fi
    mkdir -p "$HDD_CG"
}

hdd_throttle() { # MAJ:MIN
    local bps=$((HDD_MBPS * 1024 * 1024))
    if [ "$HDD_CGV" = 1 ]; then
        echo "$1 $bps" > "$HDD_CG/blkio.throttle.read_bps_device" &&
        echo "$1 $bps" > "$HDD_CG/blkio.throttle.write_bps_device"
    else
        echo "$1 rbps=$bps wbps=$bps" > "$HDD_CG/io.max"
    fi
}

hdd_up() {
    local n=$1 gib=$2 i img dev
    [ "$(id -u)" = 0 ] || { hdd_die "needs root (loop devices, mount, cgroups)"; return 1; }
    hdd_cgroup_init || return 1
    mkdir -p "$HDD_ROOT"
    for ((i = 0; i < n; i++)); do
        img=$HDD_ROOT/d$i.img
        rm -f "$img"
        truncate -s "${gib}G" "$img" || return 1
        dev=$(losetup -f --show --direct-io=on "$img") || { hdd_die "losetup $img failed"; return 1; }
        HDD_DEVS+=("$dev")
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 -m 0 "$dev" || return 1
        mkdir -p "$HDD_ROOT/d$i"
        mount -o noatime "$dev" "$HDD_ROOT/d$i" || return 1
        HDD_MAJMIN+=("$(lsblk -dno MAJ:MIN "$dev" | tr -d ' ')")
        hdd_throttle "${HDD_MAJMIN[$i]}" || return 1
    done
    echo "hdd model: $n drives of ${gib} GiB at $HDD_MBPS MiB/s each under $HDD_ROOT (cgroup v$HDD_CGV)"
}

hdd_exec() { ( echo "$BASHPID" > "$HDD_CG/cgroup.procs" && exec "$@" ); }

hdd_drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Bytes read from each drive's block device (sectors x 512), from /sys.
hdd_read_bytes() { # DEV
    local b; b=$(basename "$1")
    awk '{printf "%.0f\n", $3 * 512}' "/sys/block/$b/stat"
}
declare -A HDD_BASE
hdd_reset() { local d; for d in "${HDD_DEVS[@]}"; do HDD_BASE[$d]=$(hdd_read_bytes "$d"); done; }
hdd_stats() { local i d; for ((i = 0; i < ${#HDD_DEVS[@]}; i++)); do d=${HDD_DEVS[$i]}; echo "d$i $(( $(hdd_read_bytes "$d") - ${HDD_BASE[$d]:-0} ))"; done; }

hdd_down() {
    local i
    for ((i = ${#HDD_DEVS[@]} - 1; i >= 0; i--)); do
        umount "$HDD_ROOT/d$i" 2>/dev/null
        losetup -d "${HDD_DEVS[$i]}" 2>/dev/null
        rm -f "$HDD_ROOT/d$i.img"
        rmdir "$HDD_ROOT/d$i" 2>/dev/null
    done
    HDD_DEVS=(); HDD_MAJMIN=()
    [ -n "$HDD_CG" ] && rmdir "$HDD_CG" 2>/dev/null
    HDD_CG=""
    return 0
}
