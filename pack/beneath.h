/* Writing files beneath one directory and nowhere else (`kpack export DIR`,
 * docs/RELIABILITY.md "Export writes only inside DIR").
 *
 * Whoever can write into DIR can plant symbolic links, FIFOs, device nodes
 * or hard links where export will write; a user may have left anything
 * there.  So every name below DIR is opened one component at a time,
 * relative to its parent directory's descriptor, with O_NOFOLLOW: a
 * directory component must be a real directory (not a link to one), files
 * are created with O_EXCL (never opened through whatever is at the name),
 * a finished file is renamed into place without replacing anything
 * (RENAME_NOREPLACE), and what cannot be proven safe is refused with a
 * message naming it.  Names are the recipe's (FORMAT.md §9.2: components
 * that are not empty, "." or ".."), so no component leaves its parent: one
 * openat(O_NOFOLLOW) per component is the whole path walk, and
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) would check nothing more
 * (directories must be created component by component anyway).  DIR itself
 * is the user's choice and may be a symbolic link. */
#ifndef BENEATH_H
#define BENEATH_H

#include <stddef.h>
#include <sys/stat.h>

/* What kb_walk found at a path below DIR. */
enum {
    KB_ABSENT = 0,    /* the name, or a directory on the way to it, does not exist (yet) */
    KB_PRESENT = 1,   /* it exists: *st says what it is (lstat: a link is a link) */
};

/* DIR opened (created if missing, one level): a directory descriptor, or -1
 * with err. */
int kb_open_root(const char *dir, char *err, size_t errlen);

/* The directory holding `name` (a recipe name, '/'-separated) below the
 * root descriptor: its descriptor (the caller closes it; it may be root
 * itself, returned dup'ed) and, in *base, name's last component.  With
 * create, missing directories are made (0755).  -1 with err when a
 * component on the way is a symbolic link, not a directory, or cannot be
 * opened or made; with !create, also KB_ABSENT (returns -2) when one does
 * not exist yet. */
int kb_parent(int root, const char *dir, const char *name, int create, const char **base, char *err, size_t errlen);

/* lstat of name below root without creating anything: KB_PRESENT with *st,
 * KB_ABSENT, or -1 with err (a link or non-directory on the way, I/O). */
int kb_stat(int root, const char *dir, const char *name, struct stat *st, char *err, size_t errlen);

/* A new regular file `base` in the directory pfd, opened O_WRONLY: created
 * with O_EXCL | O_NOFOLLOW.  An existing regular file there (one an
 * interrupted run left) is unlinked first — never opened, so a hard link's
 * other names keep their bytes; anything else there (a symbolic link, a
 * FIFO, a device node, a directory, a socket) is refused: -1 with err. */
int kb_create(int pfd, const char *shown, const char *base, char *err, size_t errlen);

/* An existing regular file with one link, or a new one, opened O_RDWR (a
 * journal written in place): a symbolic link, a hard link (nlink > 1) or
 * anything but a regular file is refused. */
int kb_open_rw(int pfd, const char *shown, const char *base, char *err, size_t errlen);

/* rename(from, to) in the directory pfd, failing (EEXIST) rather than
 * replacing an existing `to`: renameat2(RENAME_NOREPLACE), else link +
 * unlink where the filesystem lacks it.  0, or -1 with errno. */
int kb_publish(int pfd, const char *from, const char *to);

#endif
