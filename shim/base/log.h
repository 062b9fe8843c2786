/* A logger that never allocates: format into a stack buffer, write(2) to stderr. */
#ifndef PINSHIM_LOG_H
#define PINSHIM_LOG_H

enum { LOG_WARN = 0, LOG_INFO = 1, LOG_DEBUG = 2 };

/* Printed when level <= PINSHIM_LOG (warnings always; they are for bad settings and for
 * failures the user must know about).  One line, prefixed "pinshim[pid]: ". */
void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log only the first time this call site runs (flag is a static int at the call site). */
#define shim_log_once(level, ...)                                         \
    do {                                                                  \
        static int logged_;                                               \
        if (!__atomic_exchange_n(&logged_, 1, __ATOMIC_RELAXED))          \
            shim_log(level, __VA_ARGS__);                                 \
    } while (0)

/* Where the log goes; tests point it at a pipe. */
void log_set_fd(int fd);

#endif
