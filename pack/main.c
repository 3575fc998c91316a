/* kpack: verify a Kimi K3 download, repack it into one KPK file, give it back. */
#include "cli.h"
#include "format/kpk.h"

#include <string.h>

static const char usage[] =
    "usage: kpack COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  check-source DIR     verify a downloaded checkpoint (every shard present, whole,\n"
    "                       every tensor right; SHA-256 with --sha256 or an HF snapshot)\n"
    "  convert SRC OUT.kpk  repack it (or re-lay out a KPK file) into a page-aligned,\n"
    "                       checksummed KPK file, or a set of member files on several\n"
    "                       disks (crash-safe and resumable)\n"
    "  verify FILE.kpk      re-hash every extent, decode every block, check all padding\n"
    "                       and that the file holds the model its config describes\n"
    "  info FILE.kpk        configuration, extents, member files, provenance\n"
    "  cat FILE.kpk NAME    write one tensor's original bytes to stdout\n"
    "  export FILE.kpk DIR  write the original files of the download back, byte-identical\n"
    "                       (--check: rebuild them in memory and compare their SHA-256)\n"
    "\n"
    "  --version            the release, and the KPK format versions kpack reads and writes\n"
    "\n"
    "Run `kpack COMMAND --help` for a command's options.\n"
    "\n"
    "Exit codes: 0 success / intact; 1 the source or file checked is bad\n"
    "(problems are named); 2 cannot run (usage, unreadable or not a KPK file,\n"
    "a newer format, a member file of a set missing or wrong, output exists,\n"
    "not enough space, I/O error).\n";

int main(int argc, char **argv)
{
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"check-source", cmd_check_source}, {"convert", cmd_convert}, {"verify", cmd_verify},
        {"info", cmd_info}, {"cat", cmd_cat}, {"export", cmd_export},
    };
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? KX_FAIL : KX_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        kpk_release_print(stdout, "kpack", 1);
        return KX_OK;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].fn(argc - 1, argv + 1);
    kx_error("unknown command %s", argv[1]);
    fputs(usage, stderr);
    return KX_FAIL;
}
