/* The event trace (see trace.h).  Never allocates: a line is formatted on the stack. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "base/config.h"
#include "base/log.h"
#include "base/os.h"
#include "stats/trace.h"

#define TRACE_FD_MIN 800

int trace_fd = -1;
static dev_t trace_dev;
static ino_t trace_ino;

void trace_open(void)
{
    if (!shim_cfg.trace[0] || trace_fd >= 0 || shim_cfg.mode == MODE_OFF)
        return;
    char path[1024];
    if (!config_expand_path_checked(shim_cfg.trace, path, sizeof path)) {
        shim_log(LOG_WARN, "PINSHIM_TRACE=%s: the expanded path is too long; no trace", shim_cfg.trace);
        return;
    }
    /* Appended to, never truncated: a forked child keeps the descriptor, and a program the process
     * starts opens the same file again; each writes whole lines.
     * Non-blocking open, so that a FIFO nobody reads fails at once instead of hanging start-up. */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd < 0) {
        shim_log(LOG_WARN, "PINSHIM_TRACE: cannot open %s: %s; no trace", path, strerror(errno));
        return;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    /* Far from the numbers the program's own files get, and remembered by identity: a program
     * that closes descriptors it does not know and opens files of its own must never receive a
     * line (trace_event checks before each write). */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, TRACE_FD_MIN);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return;
    }
    trace_dev = st.st_dev;
    trace_ino = st.st_ino;
    __atomic_store_n(&trace_fd, fd, __ATOMIC_RELEASE);
}

/* Whether fd is still the file trace_open opened; if not, the trace stops. */
static int still_ours(int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == trace_dev && st.st_ino == trace_ino)
        return 1;
    __atomic_store_n(&trace_fd, -1, __ATOMIC_RELEASE);
    return 0;
}

void trace_event(uint64_t dur, const char *event, const char *fmt, ...)
{
    int fd = __atomic_load_n(&trace_fd, __ATOMIC_ACQUIRE);
    if (fd < 0)
        return;
    int saved_errno = errno;
    if (!still_ours(fd)) {
        errno = saved_errno;
        return;
    }
    uint64_t end = shim_now_ns();
    char line[512];
    const size_t room = sizeof line - 1;
    int n = snprintf(line, room, "%llu.%06llu %llu.%03llu %d %d %s ", (unsigned long long)(end / 1000000000ull),
                     (unsigned long long)(end / 1000ull % 1000000ull), (unsigned long long)(dur / 1000ull),
                     (unsigned long long)(dur % 1000ull), (int)getpid(), (int)syscall(SYS_gettid), event);
    if (n < 0)
        n = 0;
    if ((size_t)n >= room)
        n = (int)room - 1;   /* the header alone filled the line (it cannot, with the shim's names) */
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, room - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len > room - 1)
        len = room - 1;
    line[len++] = '\n';
    os_write_all(fd, line, len);
    errno = saved_errno;
}
