#!/usr/bin/env python3
"""The manual page of a tool against its --help (tests/cli/test_man.sh).

    man_help.py TOOL_BINARY PAGE
    man_help.py --options TOOL_BINARY   (every command's options, as "COMMAND OPTION" lines;
                                         test_completion.sh)

Every option a command's --help defines must be an item (`.It Fl \\-name`) in
the page's sections for that command, and every item of those sections must be
named by that --help.  A section says whose options it holds in a comment
right after its `.Ss` line:

    .Ss krun serve
    .\\" help: krun serve
    .Ss Memory options
    .\\" help: krun, krun chat, krun serve, krun batch

(`krun` alone is `krun --help`; `kpack` alone is `kpack --help`.)

What --help "defines": an option at the start of an indented line (with the
options and arguments that follow it there: `--top-k K  --top-p P  --min-p P`),
and every option of the usage lines (from `usage:` to the first empty line).
An option named only inside a sentence (`unless --ignore-eos`, `see kpack
export --check`) is not a definition, but it counts for the reverse check: a
page may document an option its --help only mentions.

The commands come from the tool's own --help: kpack's "Commands:" list, krun's
usage lines (`krun NAME MODEL.kpk`).  Prints TAP lines; each "not ok" names
the option, the command and the line to add.
"""
import os
import re
import subprocess
import sys

OPT = re.compile(r"--[a-z0-9][a-z0-9-]*")
# an argument word after an option in a definition: SIZE, N, DIR,DIR,..., a|b|c, P[,P2,...], auto|N
ARG = re.compile(r"^(\||[A-Z0-9_.,\[\]|-]+|[A-Za-z0-9-]+(\|[A-Za-z0-9-]+)+)$")
ALWAYS = {"--help"}  # every command takes it; the page says so once


def help_text(tool, cmd):
    argv = [tool] + ([cmd] if cmd else []) + ["--help"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("not ok - %s exited %d" % (" ".join(argv), r.returncode))
    return r.stdout


def definitions(text):
    """The options a --help text defines (see the module's comment)."""
    found = set()
    lines = text.splitlines()
    in_usage = False
    for line in lines:
        if line.startswith("usage:"):
            in_usage = True
        if in_usage:
            if not line.strip():
                in_usage = False
            else:
                found.update(OPT.findall(line))
                continue
        m = re.match(r"^ {1,4}(--.*)$", line)
        if not m:
            continue
        for word in m.group(1).split():
            word = word.rstrip(",")
            if OPT.fullmatch(word):
                found.add(word)
            elif not ARG.match(word):
                break
    return found - ALWAYS


def commands(tool, name, top):
    """The subcommands the tool's top-level --help names."""
    if name == "kpack":
        block = top.split("Commands:", 1)[1].split("\n\n", 1)[0]
        return re.findall(r"^  ([a-z][a-z-]*) ", block, re.M)
    return sorted(set(re.findall(r"^(?:usage:)? +krun ([a-z]+) MODEL\.kpk", top, re.M)))


def page_sections(path):
    """[(title, [commands], {option: line number})] of the page's subsections."""
    sections = []
    cur = None
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith(".Ss ") or line.startswith(".Sh "):
                cur = [line[4:].strip('"'), None, {}, no]
                sections.append(cur)
            elif cur is not None and cur[1] is None and line.startswith('.\\" help:'):
                cur[1] = [c.strip() for c in line.split("help:", 1)[1].split(",") if c.strip()]
            elif cur is not None and line.startswith(".It ") and cur[1] is not None:
                for o in re.findall(r"Fl \\-([a-z0-9][a-z0-9-]*)", line):
                    cur[2].setdefault("--" + o, no)
    return [(t, cmds, items, no) for t, cmds, items, no in sections if cmds is not None]


def main():
    if sys.argv[1] == "--options":  # man_help.py --options TOOL: "COMMAND OPTION" lines, COMMAND - for the tool itself
        tool = sys.argv[2]
        for c in [""] + commands(tool, os.path.basename(tool), help_text(tool, "")):
            for o in sorted(definitions(help_text(tool, c))):
                print(c or "-", o)
        return 0
    tool, page = sys.argv[1], sys.argv[2]
    name = os.path.basename(tool)
    pname = "%s(1) (%s)" % (name, page)
    top = help_text(tool, "")
    cmds = [""] + commands(tool, name, top)
    label = lambda c: name + (" " + c if c else "")
    sections = page_sections(page)
    fails = 0

    def fail(msg):
        nonlocal fails
        fails += 1
        print("not ok - " + msg)

    by_cmd = {label(c): [] for c in cmds}
    for title, owners, items, no in sections:
        for o in owners:
            if o not in by_cmd:
                fail("%s line %d: `.Ss %s` holds options of `%s`, which %s --help does not name as a command"
                     % (pname, no, title, o, name))
            else:
                by_cmd[o].append((title, items))
    lacking = {}  # option -> the commands whose --help defines it and whose sections lack it
    for c in cmds:
        cl = label(c)
        text = help_text(tool, c)
        defined = definitions(text)
        named = set(OPT.findall(text))
        if not by_cmd[cl]:
            fail("%s has no section for `%s`: add `.Ss %s` followed by `.\\\" help: %s` and an item per option"
                 % (pname, cl, cl, cl))
            continue
        items = {}
        for title, its in by_cmd[cl]:
            for o in its:
                items.setdefault(o, title)
        missing = sorted(defined - set(items))
        for o in missing:
            lacking.setdefault(o, []).append(cl)
        extra = sorted(o for o in items if o not in named)
        for o in extra:
            fail("%s documents %s under `.Ss %s` for `%s`, but `%s --help` does not name it: remove the item or "
                 "add the option to the help" % (pname, o, items[o], cl, cl))
        if not missing and not extra:
            print("ok - %s: the %d options `%s --help` defines are in the page, and the page's %d items for it are in "
                  "the help" % (pname, len(defined), cl, len(items)))
    # An option several commands define goes in each one's section, or once in a section that they
    # (and only they) share: krun's memory, sampling and execution options are written once.
    for o in sorted(lacking):
        who = lacking[o]
        helps = ", ".join("`%s --help`" % cl for cl in who)
        own = []
        for cl in who:
            mine = [t for t, owners, _, _ in sections if owners == [cl]]
            own.append("`.Ss %s`" % (mine[0] if mine else cl))
        if len(who) == 1:
            fail("%s lacks %s, which %s lists: add `.It Fl \\%s ...` and its text under %s" % (pname, o, helps, o[1:], own[0]))
            continue
        shared = [t for t, owners, _, _ in sections if sorted(owners) == sorted(who)]
        once = (" or ".join("`.Ss %s`" % t for t in shared) + ", the section these commands share" if shared else
                "a new section whose `.\\\" help:` line is `%s`" % ", ".join(who))
        fail("%s lacks %s, which %s list: add `.It Fl \\%s ...` and its text under each of %s, or once under %s"
             % (pname, o, helps, o[1:], ", ".join(own), once))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
