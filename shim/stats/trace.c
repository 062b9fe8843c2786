/* The event trace (see trace.h).  Never allocates: a line is formatted on the stack. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sched.h>
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

/* One whole line, newline included, into line[TRACE_LINE]: the event's header (end time now,
 * duration, pid, thread id, name), then `fmt`'s fields.  Returns its length. */
#define TRACE_LINE 512
static size_t format_line(char *line, uint64_t dur, const char *event, const char *fmt, va_list ap)
{
    uint64_t end = shim_now_ns();
    const size_t room = TRACE_LINE - 1;
    int n = snprintf(line, room, "%llu.%06llu %llu.%03llu %d %d %s ", (unsigned long long)(end / 1000000000ull),
                     (unsigned long long)(end / 1000ull % 1000000ull), (unsigned long long)(dur / 1000ull),
                     (unsigned long long)(dur % 1000ull), (int)getpid(), (int)syscall(SYS_gettid), event);
    if (n < 0)
        n = 0;
    if ((size_t)n >= room)
        n = (int)room - 1;   /* the header alone filled the line (it cannot, with the shim's names) */
    int m = vsnprintf(line + n, room - (size_t)n, fmt, ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len > room - 1)
        len = room - 1;
    line[len++] = '\n';
    return len;
}

static size_t format_linef(char *line, uint64_t dur, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t format_linef(char *line, uint64_t dur, const char *event, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t len = format_line(line, dur, event, fmt, ap);
    va_end(ap);
    return len;
}

/* Lines of the shim's own threads wait here for one of the program's threads to write them.
 * A descriptor can be checked (still_ours) and then written only where nothing can reuse its
 * number in between: a program that closes every descriptor it did not open and opens files of
 * its own in their place does so on its own thread, so a line written from one of the shim's
 * threads could land in the program's file; one written by the program's thread cannot (there,
 * check and write run between its own calls).  Multithreaded programs that reuse descriptors on
 * one thread while another copies keep that window (docs/contract.md, rule 9). */
#define PENDING_LINES 64
static char pending[PENDING_LINES][TRACE_LINE];
static unsigned short pending_len[PENDING_LINES];
static unsigned pending_count, pending_lost;   /* under pending_lock */
static pid_t pending_pid;                      /* the process whose threads queued them */
static int pending_lock;

static int pending_trylock(void)
{
    return !__atomic_exchange_n(&pending_lock, 1, __ATOMIC_ACQUIRE);
}

static void pending_unlock(void)
{
    __atomic_store_n(&pending_lock, 0, __ATOMIC_RELEASE);
}

/* On one of the shim's threads (their signals blocked: no handler can hold the lock there). */
static void pending_add(const char *line, size_t len)
{
    for (unsigned spins = 0; !pending_trylock(); spins++)
        if (spins > 64)
            sched_yield();
    if (pending_count == 0)
        pending_pid = getpid();
    if (pending_count < PENDING_LINES) {
        memcpy(pending[pending_count], line, len);
        pending_len[pending_count] = (unsigned short)len;
        __atomic_store_n(&pending_count, pending_count + 1, __ATOMIC_RELAXED);   /* read unlocked */
    } else {
        pending_lost++;
    }
    pending_unlock();
}

/* On a program's thread: the queued lines first.  Only tried: a signal handler that interrupted
 * this thread's own flush leaves them for later. */
static void pending_write(int fd)
{
    if (!__atomic_load_n(&pending_count, __ATOMIC_RELAXED) || !pending_trylock())
        return;
    if (pending_pid == getpid()) {   /* not a fork child's copy of its parent's lines */
        for (unsigned i = 0; i < pending_count; i++)
            if (still_ours(fd))
                os_write_all(fd, pending[i], pending_len[i]);
        if (pending_lost) {
            char line[TRACE_LINE];
            size_t len = format_linef(line, 0, "trace_lost", "lines=%u", pending_lost);
            if (still_ours(fd))
                os_write_all(fd, line, len);
        }
    }
    __atomic_store_n(&pending_count, 0, __ATOMIC_RELAXED);
    pending_lost = 0;
    pending_unlock();
}

void trace_event(uint64_t dur, const char *event, const char *fmt, ...)
{
    int fd = __atomic_load_n(&trace_fd, __ATOMIC_ACQUIRE);
    if (fd < 0)
        return;
    int saved_errno = errno;
    char line[TRACE_LINE];
    va_list ap;
    va_start(ap, fmt);
    size_t len = format_line(line, dur, event, fmt, ap);
    va_end(ap);
    if (shim_own_thread) {
        pending_add(line, len);
    } else {
        pending_write(fd);
        if (still_ours(fd))
            os_write_all(fd, line, len);
    }
    errno = saved_errno;
}

void trace_flush(void)
{
    int fd = __atomic_load_n(&trace_fd, __ATOMIC_ACQUIRE);
    if (fd < 0 || shim_own_thread)
        return;
    int saved_errno = errno;
    pending_write(fd);
    errno = saved_errno;
}
