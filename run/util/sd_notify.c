/* The sd_notify datagram (sd_notify.h). */
#include "sd_notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int krun_sd_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    size_t n;
    ssize_t sent;
    int fd, saved;
    if (!path || !*path) return 0;
    n = strlen(path);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if ((path[0] != '/' && path[0] != '@') || n < 2 || n > sizeof sa.sun_path) {
        errno = EINVAL;
        return -1;
    }
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') sa.sun_path[0] = 0;   /* the abstract namespace: the length counts, no terminator */
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&sa,
                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    saved = errno;
    close(fd);
    errno = saved;
    return sent == (ssize_t)strlen(state) ? 1 : -1;
}
