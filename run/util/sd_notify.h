/* systemd's readiness protocol (sd_notify(3)) without libsystemd: under a
 * Type=notify unit, systemd sets $NOTIFY_SOCKET to an AF_UNIX datagram socket
 * (a path, or an abstract name when it begins with '@'), and a service sends
 * it newline-separated KEY=VALUE lines: READY=1 once it serves, STOPPING=1
 * when it begins to stop, STATUS=... for `systemctl status`.  One datagram,
 * no reply: the protocol is the whole of what libsystemd's sd_notify does for
 * these keys, so krun needs no new library for it (docs/SERVE.md, "As a
 * service").  The socket of systemd 254's vsock: form is not supported. */
#ifndef KRUN_SD_NOTIFY_H
#define KRUN_SD_NOTIFY_H

/* Sends state to $NOTIFY_SOCKET.  1 sent; 0 the variable is not set (not run
 * by systemd, or not Type=notify): nothing to do; -1 the variable is set but
 * the datagram could not be sent (errno says why). */
int krun_sd_notify(const char *state);

#endif
