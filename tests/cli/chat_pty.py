"""Drive `krun chat` on a pseudo-terminal, as a person at a keyboard would (tests/cli/test_krun_chat.sh).

  chat_pty.py OUT.bin SCRIPT.json -- KRUN ARGS...

SCRIPT is a list of steps: {"send": "text"} writes to the terminal (\\r is Enter, \\x03 Ctrl-C,
\\x04 Ctrl-D, \\x1b[200~ ... \\x1b[201~ a bracketed paste); {"wait": "text", "timeout": s} reads until
the text has appeared (counting from the previous wait's match); {"wait_count": "text", "n": k}
until it has appeared k times in all.  Everything the program wrote is saved to OUT.bin; the exit
status is the program's (124 if a wait timed out).  KPK_SLOW=N multiplies every timeout by N
(make test-arm64-full: the program runs under an emulator)."""
import json
import os
import pty
import select
import sys
import time

SLOW = float(os.environ.get("KPK_SLOW", "1"))

def main():
    out_path, script_path = sys.argv[1], sys.argv[2]
    argv = sys.argv[sys.argv.index("--") + 1:]
    script = json.load(open(script_path))
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    buf = b""
    seen = 0

    def read_some(deadline):
        nonlocal buf
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.time()))
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                return False
            buf += data
        return True

    status = None
    for step in script:
        if "send" in step:
            os.write(fd, step["send"].encode())
            continue
        deadline = time.time() + step.get("timeout", 60) * SLOW
        if "wait" in step:
            want = step["wait"].encode()
            while buf.find(want, seen) < 0 and time.time() < deadline:
                if not read_some(deadline):
                    break
            at = buf.find(want, seen)
            if at < 0:
                status = 124
                break
            seen = at + len(want)
        elif "wait_count" in step:
            want = step["wait_count"].encode()
            while buf.count(want) < step["n"] and time.time() < deadline:
                if not read_some(deadline):
                    break
            if buf.count(want) < step["n"]:
                status = 124
                break
    if status == 124:
        os.kill(pid, 9)
    deadline = time.time() + 60 * SLOW
    while time.time() < deadline:
        if not read_some(deadline):
            break
    _, st = os.waitpid(pid, 0)
    open(out_path, "wb").write(buf)
    if status is None:
        status = os.waitstatus_to_exitcode(st)
    return status


if __name__ == "__main__":
    sys.exit(main())
