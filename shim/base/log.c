/* The logger: never allocates (it may run inside malloc), one write(2) per line so that lines
 * from several threads or processes do not interleave. */
#include "base/log.h"
#include "base/config.h"
#include "base/os.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_fd = 2;

void log_set_fd(int fd) { __atomic_store_n(&log_fd, fd, __ATOMIC_RELAXED); }

void shim_log(int level, const char *fmt, ...)
{
    if (level > LOG_WARN && (uint64_t)level > shim_cfg.log_level)
        return;

    int saved_errno = errno;   /* the program must not see our errno */
    char line[1024];
    const size_t room = sizeof line - 1;   /* keep one byte for the newline */
    int prefix = snprintf(line, room, "pinshim[%d]: ", (int)getpid());
    if (prefix < 0)
        prefix = 0;

    va_list ap;
    va_start(ap, fmt);
    int body = vsnprintf(line + prefix, room - (size_t)prefix, fmt, ap);
    va_end(ap);
    if (body < 0)
        body = 0;

    size_t len = (size_t)prefix + (size_t)body;
    if (len >= room) {   /* cut short: say so */
        len = room - 1;
        memcpy(line + len - 3, "...", 3);
    }
    /* One message, one line, whatever the arguments contained. */
    for (size_t i = (size_t)prefix; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';

    os_write_all(__atomic_load_n(&log_fd, __ATOMIC_RELAXED), line, len);
    errno = saved_errno;
}
