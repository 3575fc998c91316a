#!/usr/bin/env python3
"""systemd's side of Type=notify, for krun serve (tests/cli/test_systemd.sh).

    notify_run.py SOCKET [--model FILE] [--cache DIR] -- CMD...

Binds SOCKET (a path, or @name for the abstract namespace) as systemd does for $NOTIFY_SOCKET,
runs CMD with NOTIFY_SOCKET=SOCKET, and waits for READY=1.  At that moment it asks GET /health
on the port STATUS names (READY must mean "answers requests"), reads the process's uid and
whether it reads the model file with O_DIRECT (/proc/PID/fdinfo), sends one completion, waits
for the prefix cache's first file in DIR (--cache), then sends SIGTERM and waits for
STOPPING=1 and the exit.  Prints one JSON object with what it saw.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

O_DIRECT = 0o40000


def main():
    args = sys.argv[1:]
    sock_name = args.pop(0)
    model = cache = None
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--model":
            model = os.path.realpath(args.pop(0))
        elif opt == "--cache":
            cache = args.pop(0)
    cmd = args[1:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if sock_name.startswith("@"):
        s.bind("\0" + sock_name[1:])
    else:
        s.bind(sock_name)
    s.settimeout(60)
    out = {"messages": []}
    p = subprocess.Popen(cmd, env=dict(os.environ, NOTIFY_SOCKET=sock_name), stdout=subprocess.DEVNULL,
                         stderr=open(os.environ.get("NOTIFY_RUN_ERR", os.devnull), "w"))
    try:
        msg = s.recv(4096).decode()
    except socket.timeout:
        p.kill()
        out["exit"] = p.wait()
        print(json.dumps(out))
        return
    out["messages"].append(msg)
    out["ready"] = msg
    m = re.search(r"on port (\d+)", msg)
    port = int(m.group(1)) if m else 0
    try:
        out["ready_health"] = urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=10).status
    except Exception as e:  # refused: READY came before the server listened
        out["ready_health"] = str(e)
    status = open("/proc/%d/status" % p.pid).read()
    out["uid"] = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
    if model:
        out["odirect"] = False
        for fd in os.listdir("/proc/%d/fd" % p.pid):
            try:
                if os.readlink("/proc/%d/fd/%s" % (p.pid, fd)) != model:
                    continue
                flags = int(re.search(r"^flags:\s+(\d+)", open("/proc/%d/fdinfo/%s" % (p.pid, fd)).read(), re.M).group(1), 8)
            except OSError:
                continue
            out["odirect"] = out["odirect"] or bool(flags & O_DIRECT)
    body = json.dumps({"prompt": "Hello, systemd", "max_tokens": 4}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    if os.environ.get("KRUN_API_KEY"):
        req.add_header("Authorization", "Bearer " + os.environ["KRUN_API_KEY"])
    try:
        out["request"] = urllib.request.urlopen(req, timeout=60).status
    except Exception as e:
        out["request"] = str(e)
    if cache:
        t0 = time.time()
        while time.time() - t0 < 20 and not any(files for _, _, files in os.walk(cache)):
            time.sleep(0.1)
        out["cache_files"] = sum(len(files) for _, _, files in os.walk(cache))
    p.send_signal(signal.SIGTERM)
    try:
        msg = s.recv(4096).decode()
        out["messages"].append(msg)
        out["stopping"] = msg
    except socket.timeout:
        pass
    out["exit"] = p.wait(timeout=60)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
