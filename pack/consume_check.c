/* The safety rails of `convert --consume` (consume.h): before anything is
 * written, every shard it will delete can be deleted, and deleting it gives
 * its space back; nothing it writes is a file it deletes. */
#include "consume_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* The filesystem type, for messages. */
static const char *fs_type(const char *dir)
{
    static const struct { long magic; const char *name; } t[] = {
        {0xEF53, "ext4"}, {0x58465342, "xfs"}, {0x9123683E, "btrfs"}, {0x01021994, "tmpfs"}, {0x6969, "nfs"},
        {0xFF534D42, "cifs"}, {0xFE534D42, "smb2"}, {0x65735546, "fuse"}, {0x4d44, "vfat"}, {0x5346544e, "ntfs"},
        {0x7366746e, "ntfs3"}, {0x9660, "iso9660"}, {0x73717368, "squashfs"}, {0x794c7630, "overlayfs"},
        {0x2fc12fc1, "zfs"}, {0xF2F52010, "f2fs"}, {0x2011BAB0, "exfat"},
    };
    struct statfs s;
    if (statfs(dir, &s) != 0) return "unknown";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if ((long)s.f_type == t[i].magic) return t[i].name;
    return "another type";
}

/* Can this process delete path (a regular file whose name is in dir)? */
static int deletable(const char *path, char *err, size_t errlen)
{
    char *copy = strdup(path), *dir;
    struct statvfs vfs;
    struct stat st, ds;
    int fd, rc = -1;
    unsigned flags = 0;
    if (!copy) { snprintf(err, errlen, "out of memory"); return -1; }
    dir = dirname(copy);
    if (statvfs(dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY)) {
        snprintf(err, errlen, "%s is on a read-only filesystem (%s, mounted read-only at or above %s): --consume cannot "
                 "delete it. Remount it read-write, or convert without --consume", path, fs_type(dir), dir);
        goto out;
    }
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0) {
        snprintf(err, errlen, "--consume cannot delete %s: %s may not be changed by this user (%s; a %s filesystem). Run "
                 "as its owner, or convert without --consume", path, dir, strerror(errno), fs_type(dir));
        goto out;
    }
    if (stat(path, &st) != 0 || stat(dir, &ds) != 0) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto out; }
    if ((ds.st_mode & S_ISVTX) && geteuid() != 0 && geteuid() != st.st_uid && geteuid() != ds.st_uid) {
        snprintf(err, errlen, "--consume cannot delete %s: it belongs to another user (uid %u) in a directory only owners "
                 "may delete from (sticky, like /tmp). Run as its owner, or convert without --consume", path, (unsigned)st.st_uid);
        goto out;
    }
    /* chattr +i or +a on the file or its directory: not even root deletes it */
    for (int k = 0; k < 2; k++) {
        const char *what = k ? dir : path;
        if ((fd = open(what, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0) continue;
        if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL))) {
            snprintf(err, errlen, "--consume cannot delete %s: %s is %s (chattr +%c). Clear it with chattr -%c, or convert "
                     "without --consume", path, what, flags & FS_IMMUTABLE_FL ? "immutable" : "append-only",
                     flags & FS_IMMUTABLE_FL ? 'i' : 'a', flags & FS_IMMUTABLE_FL ? 'i' : 'a');
            close(fd);
            goto out;
        }
        close(fd);
    }
    rc = 0;
out:
    free(copy);
    return rc;
}

/* Another link under dir (recursively) to the file blob (its real path),
 * other than skip (a real path): its path in *found. */
static int other_link(const char *dir, const char *blob, const char *skip, char **found)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) return 0;
    while (!*found && (e = readdir(d))) {
        char *path, *real;
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (asprintf(&path, "%s/%s", dir, e->d_name) < 0) break;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (!((real = realpath(path, NULL)) && strcmp(real, skip) == 0)) other_link(path, blob, skip, found);
            free(real);
        } else if (S_ISLNK(st.st_mode) && (real = realpath(path, NULL))) {
            if (strcmp(real, blob) == 0) { *found = path; path = NULL; }
            free(real);
        }
        free(path);
    }
    closedir(d);
    return *found != NULL;
}

/* The shard's blob, when SRC is a Hugging Face snapshot and --consume-blobs. */
static int hf_blob(struct kc_state *c, size_t s, int blobs, char *err, size_t errlen)
{
    const ks_shard *ks = &c->src->shards[s];
    char *blob, *cache = NULL, *snap = realpath(c->src->dir, NULL), *found = NULL;
    if (!blobs) {
        snprintf(err, errlen, "%s is a Hugging Face cache snapshot: its shards are symbolic links into the cache's blobs/ "
                 "directory, so deleting them frees nothing. To consume the blobs themselves (each shard's blob deleted with "
                 "its link once its bytes are in the output; other files of the cache are left alone), add --consume-blobs; "
                 "or download to a plain directory (`hf download REPO --local-dir DIR`) and consume that", c->src->dir);
        free(snap);
        return -1;
    }
    if (!(blob = realpath(ks->path, NULL))) { snprintf(err, errlen, "%s: %s", ks->path, strerror(errno)); free(snap); return -1; }
    /* the repo's snapshots/ is next to its blobs/: no other revision may use the blob */
    if (asprintf(&cache, "%s/../snapshots", dirname(strdupa(blob))) < 0) cache = NULL;
    if (cache && snap && other_link(cache, blob, snap, &found)) {
        snprintf(err, errlen, "%s's blob %s is also used by %s (another snapshot of the cache): deleting it would break "
                 "that one. Remove that revision first (`hf cache delete`), or convert without --consume", ks->path, blob, found);
        free(found);
        free(cache);
        free(snap);
        free(blob);
        return -1;
    }
    free(cache);
    free(snap);
    free(c->sh[s].blob);
    c->sh[s].blob = blob;
    return 0;
}

/* path (an output file, existing or not) names a source shard or blob. */
static const char *same_as_source(const struct kc_state *c, const char *path)
{
    struct stat o, st;
    char *copy = strdup(path), *real_dir = NULL, *name;
    const char *hit = NULL;
    int exists = stat(path, &o) == 0;
    if (!copy) return NULL;
    name = basename(strdupa(path));
    real_dir = realpath(dirname(copy), NULL);
    for (size_t s = 0; s < c->n && !hit; s++) {
        const char *files[2] = {c->src->shards[s].path, c->sh[s].blob};
        if (!c->sh[s].present) continue;
        for (int k = 0; k < 2 && !hit; k++) {
            char *real;
            if (!files[k]) continue;
            if (exists && stat(files[k], &st) == 0 && st.st_dev == o.st_dev && st.st_ino == o.st_ino) hit = files[k];
            if (!hit && real_dir && (real = realpath(files[k], NULL))) {
                size_t dl = strlen(real_dir);
                if (strncmp(real, real_dir, dl) == 0 && real[dl] == '/' && strcmp(real + dl + 1, name) == 0) hit = files[k];
                free(real);
            }
        }
    }
    free(real_dir);
    free(copy);
    return hit;
}

int kc_check_rails(kc_state *c, int blobs, char *err, size_t errlen)
{
    const kp_plan *p = c->p;
    struct stat out_st;
    int other_fs = 0;
    c->blobs = blobs;
    for (size_t s = 0; s < c->n; s++) {
        const ks_shard *ks = &c->src->shards[s];
        struct stat l, st;
        const char *file = ks->path;
        if (!c->sh[s].present) continue;
        if (lstat(ks->path, &l) != 0 || stat(ks->path, &st) != 0) { snprintf(err, errlen, "%s: %s", ks->path, strerror(errno)); return -1; }
        if (S_ISLNK(l.st_mode)) {
            if (!ks->hf_blob) {
                snprintf(err, errlen, "%s is a symbolic link: deleting it would free nothing, and --consume deletes only the "
                         "files of the source directory (or, with --consume-blobs, a Hugging Face cache's blobs). Convert from "
                         "the directory that holds the files, or move them into %s", ks->path, c->src->dir);
                return -1;
            }
            if (hf_blob(c, s, blobs, err, errlen)) return -1;
            file = c->sh[s].blob;
        }
        if (!S_ISREG(st.st_mode)) { snprintf(err, errlen, "%s is not a regular file: --consume deletes only files", ks->path); return -1; }
        if (st.st_nlink > 1) {
            snprintf(err, errlen, "%s has %lu names (hard links): deleting this one frees nothing while the others remain. "
                     "Remove the other names (find / -samefile %s), or convert without --consume", file,
                     (unsigned long)st.st_nlink, file);
            return -1;
        }
        if (deletable(file, err, errlen)) return -1;
    }
    /* OUT, its members and the files named after it are none of the source's */
    {
        const char *suffix[] = {".journal", ".lock", ".consumed"};
        for (uint32_t m = 0; m < p->n_members + 3u; m++) {
            char *path = NULL;
            const char *hit[2] = {NULL, NULL};
            if (m < p->n_members) {
                hit[0] = same_as_source(c, p->members[m].path);
                hit[1] = same_as_source(c, p->members[m].partial);
                path = strdup(hit[0] ? p->members[m].path : p->members[m].partial);
            } else if (asprintf(&path, "%s%s", c->out, suffix[m - p->n_members]) >= 0) {
                hit[0] = same_as_source(c, path);
            } else {
                path = NULL;
            }
            if (hit[0] || hit[1]) {
                snprintf(err, errlen, "%s would be the source file %s: --consume would delete what it writes. Write the "
                         "output under another name", path ? path : "an output file", hit[0] ? hit[0] : hit[1]);
                free(path);
                return -1;
            }
            free(path);
        }
    }
    if (stat(p->members[0].dir, &out_st) == 0)
        for (size_t s = 0; s < c->n; s++) {
            int shared = 0;
            if (!c->sh[s].present) continue;
            for (uint32_t m = 0; m < p->n_members && !shared; m++) {
                struct stat ms;
                shared = stat(p->members[m].dir, &ms) == 0 && ms.st_dev == c->sh[s].dev;
            }
            other_fs |= !shared;
        }
    if (other_fs)
        snprintf(c->other_fs, sizeof c->other_fs, "the source's shards are on another filesystem than every output file: "
                 "--consume deletes them as it goes, which frees space there, not where the output is written");
    return 0;
}

const char *kc_other_fs_note(const kc_state *c) { return c->other_fs[0] ? c->other_fs : NULL; }

int kc_confirm(const char *what)
{
    char line[64];
    fprintf(stderr, "%s\nDelete each shard once its bytes are safely in the output? [y/N] ", what);
    fflush(stderr);
    if (!fgets(line, sizeof line, stdin)) return 0;
    return line[0] == 'y' || line[0] == 'Y';
}

int kc_lock_source(const char *dir, int exclusive, int *fd, char *err, size_t errlen)
{
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0) return 0; /* the source check names it */
    if (flock(*fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK) { close(*fd); *fd = -1; return 0; } /* no locks here: nothing to guard with */
    snprintf(err, errlen, "%s is being %s by another kpack convert%s; wait for it to finish", dir,
             exclusive ? "read" : "consumed (deleted as it is converted)", exclusive ? " (which needs its shards)" : " --consume");
    close(*fd);
    *fd = -1;
    return -1;
}
