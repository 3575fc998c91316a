/* pack/beneath.c at the moment of writing (the export's preflight is
 * test_export_safety's): whatever is planted after the check, a directory
 * component that is a symbolic link or not a directory is refused, a file
 * is created without opening what is at its name (a link, a FIFO), a
 * leftover regular file is replaced without being written through (a hard
 * link's other name keeps its bytes), the journal is never a link, and a
 * finished file never replaces one that appeared meanwhile. */
#include "pack/beneath.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char top[512];

static void path(char *out, size_t n, const char *rel) { snprintf(out, n, "%s/%s", top, rel); }

static int file_is(const char *rel, const char *want)
{
    char p[700], got[256];
    FILE *f;
    size_t n;
    path(p, sizeof p, rel);
    if (!(f = fopen(p, "rb"))) return 0;
    n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = 0;
    return strcmp(got, want) == 0;
}

static void put(const char *rel, const char *text)
{
    char p[700];
    FILE *f;
    path(p, sizeof p, rel);
    if (!(f = fopen(p, "wb")) || fputs(text, f) < 0 || fclose(f)) { perror(p); exit(2); }
}

static int empty_dir(const char *rel)
{
    char cmd[800], p[700];
    path(p, sizeof p, rel);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", p);
    return system(cmd) == 0;
}

int main(void)
{
    char p[700], q[700], err[900];
    const char *base = NULL;
    const char *tmp = getenv("KPK_TEST_TMP");
    int root, pfd, fd;
    struct stat st;

    snprintf(top, sizeof top, "%s/beneath.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(top)) { perror("mkdtemp"); return 2; }
    path(p, sizeof p, "elsewhere");
    mkdir(p, 0755);
    put("victim", "victim");

    path(p, sizeof p, "d");
    root = kb_open_root(p, err, sizeof err);
    CHECK(root >= 0, "kb_open_root creates and opens DIR");

    /* a directory component that is a symbolic link, made after any check */
    path(q, sizeof q, "elsewhere");
    path(p, sizeof p, "d/sub");
    if (symlink(q, p)) { perror("symlink"); return 2; }
    pfd = kb_parent(root, "D", "sub/deeper/f.json", 1, &base, err, sizeof err);
    CHECK(pfd == -1 && strstr(err, "D/sub is a symbolic link, not a directory"), "a linked directory component is refused: %s", err);
    CHECK(empty_dir("elsewhere"), "nothing was created through it");
    unlink(p);
    put("d/sub", "a file where a directory is wanted");
    pfd = kb_parent(root, "D", "sub/f.json", 1, &base, err, sizeof err);
    CHECK(pfd == -1 && strstr(err, "D/sub is a regular file, not a directory"), "a file where a directory is wanted is refused: %s", err);
    unlink(p);
    pfd = kb_parent(root, "D", "sub/deeper/f.json", 1, &base, err, sizeof err);
    CHECK(pfd >= 0 && strcmp(base, "f.json") == 0, "real directories are made and opened");
    if (pfd >= 0) close(pfd);
    pfd = kb_parent(root, "D", "nope/f.json", 0, &base, err, sizeof err);
    CHECK(pfd == -2, "without create, a missing directory is absent (-2)");

    pfd = kb_parent(root, "D", "f.json", 1, &base, err, sizeof err);
    /* a symbolic link, a FIFO at the name: never opened, refused */
    path(q, sizeof q, "victim");
    path(p, sizeof p, "d/f.json.partial");
    if (symlink(q, p)) { perror("symlink"); return 2; }
    fd = kb_create(pfd, "D/f.json.partial", "f.json.partial", err, sizeof err);
    CHECK(fd < 0 && strstr(err, "is a symbolic link"), "kb_create refuses a symbolic link: %s", err);
    CHECK(file_is("victim", "victim"), "... and does not write through it");
    unlink(p);
    if (mkfifo(p, 0644)) { perror("mkfifo"); return 2; }
    fd = kb_create(pfd, "D/f.json.partial", "f.json.partial", err, sizeof err);
    CHECK(fd < 0 && strstr(err, "is a FIFO"), "kb_create refuses a FIFO without opening it: %s", err);
    unlink(p);
    /* a hard link: replaced, the other name keeps its bytes */
    path(q, sizeof q, "victim");
    if (link(q, p)) { perror("link"); return 2; }
    fd = kb_create(pfd, "D/f.json.partial", "f.json.partial", err, sizeof err);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_nlink == 1 && st.st_size == 0, "a hard link at the name is replaced by a new file");
    CHECK(fd >= 0 && write(fd, "new bytes", 9) == 9, "written");
    CHECK(file_is("victim", "victim"), "... the hard link's other name keeps its bytes");
    if (fd >= 0) close(fd);

    /* publish never replaces: a file that appeared at the name stays */
    put("d/f.json", "appeared meanwhile");
    CHECK(kb_publish(pfd, "f.json.partial", "f.json") == -1 && errno == EEXIST, "kb_publish refuses to replace an existing name");
    CHECK(file_is("d/f.json", "appeared meanwhile") && file_is("d/f.json.partial", "new bytes"), "... both files intact");
    path(p, sizeof p, "d/f.json");
    unlink(p);
    CHECK(kb_publish(pfd, "f.json.partial", "f.json") == 0 && file_is("d/f.json", "new bytes"), "kb_publish renames to a free name");
    path(p, sizeof p, "d/f.json");
    unlink(p);
    path(q, sizeof q, "elsewhere/target");
    if (symlink(q, p)) { perror("symlink"); return 2; }
    put("d/f.json.partial", "x");
    CHECK(kb_publish(pfd, "f.json.partial", "f.json") == -1 && errno == EEXIST, "... nor a dangling symbolic link");
    CHECK(empty_dir("elsewhere"), "... and does not follow it");

    /* the journal: a file of its own */
    path(q, sizeof q, "victim");
    path(p, sizeof p, "d/j");
    if (symlink(q, p)) { perror("symlink"); return 2; }
    fd = kb_open_rw(root, "D/j", "j", err, sizeof err);
    CHECK(fd < 0 && strstr(err, "is a symbolic link"), "kb_open_rw refuses a symbolic link: %s", err);
    unlink(p);
    if (link(q, p)) { perror("link"); return 2; }
    fd = kb_open_rw(root, "D/j", "j", err, sizeof err);
    CHECK(fd < 0 && strstr(err, "is a hard link"), "kb_open_rw refuses a hard link: %s", err);
    unlink(p);
    fd = kb_open_rw(root, "D/j", "j", err, sizeof err);
    CHECK(fd >= 0 && write(fd, "journal", 7) == 7, "kb_open_rw creates a new journal");
    if (fd >= 0) close(fd);
    fd = kb_open_rw(root, "D/j", "j", err, sizeof err);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 7, "... and opens an existing one without truncating it");
    if (fd >= 0) close(fd);
    CHECK(file_is("victim", "victim"), "the victim outside DIR never changed");

    close(pfd);
    close(root);
    {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", top);
    }
    return check_exit();
}
