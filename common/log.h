/* Levelled, per-subsystem logging to stderr or DDP_LOG_FILE, configured from the environment. */
#ifndef DDP_COMMON_LOG_H
#define DDP_COMMON_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum ddp_log_level {
    DDP_LOG_NONE = 0,
    DDP_LOG_ERROR,
    DDP_LOG_WARN,
    DDP_LOG_INFO,
    DDP_LOG_DEBUG,
    DDP_LOG_TRACE,
};

enum ddp_log_subsys {
    DDP_SUB_STORE = 1 << 0,
    DDP_SUB_PG = 1 << 1,
    DDP_SUB_REDUCER = 1 << 2,
    DDP_SUB_SSH = 1 << 3,
    DDP_SUB_SUP = 1 << 4,
    DDP_SUB_ALL = 0x1f,
};

/*
 * Reads DDP_LOG_LEVEL (none|error|warn|info|debug|trace, default warn),
 * DDP_LOG_SUBSYS (comma list of store,pg,reducer,ssh,sup or all; default all)
 * and DDP_LOG_FILE (%h is replaced by the host name, %p by the pid). Called
 * lazily by the first log call; call it again after fork or setenv.
 */
void ddp_log_init(void);

/* Sets the rank shown in the line prefix; -1 shows "-". */
void ddp_log_set_rank(int rank);

/* Overrides the level from code (the CLI's --log-level). */
void ddp_log_set_level(enum ddp_log_level level);

/* True when a message at this level and subsystem would be written. */
bool ddp_log_enabled(enum ddp_log_level level, enum ddp_log_subsys sub);

void ddp_log_write(enum ddp_log_level level, enum ddp_log_subsys sub, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/*
 * A log line's rate limit: at most one line a second through one limit, and the next line that
 * passes says how many were held back meanwhile. Every port ddprun serves logs the connections it
 * refuses or drops through a limit of its own, so a flood of hostile connections costs the
 * console one line a second per port. Zero-initialised; not thread-safe (a port's limit belongs
 * to the thread that serves the port).
 */
struct ddp_log_limit {
    int64_t last_ms; /* when the last line passed, 0 before the first */
    uint64_t held;   /* lines held back since then */
};

/* As ddp_log_write, through a limit: the line is written only if a second has passed since the
 * limit's last, with " (N more like it in the last S s not shown)" appended when some were held. */
void ddp_log_write_limited(struct ddp_log_limit *lim, enum ddp_log_level level,
                           enum ddp_log_subsys sub, const char *file, int line, const char *fmt,
                           ...) __attribute__((format(printf, 6, 7)));

#define DDP__LOG(lvl, sub, ...)                                                                    \
    do {                                                                                           \
        if (ddp_log_enabled(lvl, DDP_SUB_##sub))                                                   \
            ddp_log_write(lvl, DDP_SUB_##sub, __FILE__, __LINE__, __VA_ARGS__);                    \
    } while (0)

#define DDP_ERROR(sub, ...) DDP__LOG(DDP_LOG_ERROR, sub, __VA_ARGS__)
#define DDP_WARN(sub, ...) DDP__LOG(DDP_LOG_WARN, sub, __VA_ARGS__)
#define DDP_INFO(sub, ...) DDP__LOG(DDP_LOG_INFO, sub, __VA_ARGS__)
#define DDP_DEBUG(sub, ...) DDP__LOG(DDP_LOG_DEBUG, sub, __VA_ARGS__)
#define DDP_TRACE(sub, ...) DDP__LOG(DDP_LOG_TRACE, sub, __VA_ARGS__)

/* A warning through a struct ddp_log_limit (refused and dropped connections). */
#define DDP_WARN_LIMITED(lim, sub, ...)                                                            \
    do {                                                                                           \
        if (ddp_log_enabled(DDP_LOG_WARN, DDP_SUB_##sub))                                          \
            ddp_log_write_limited(lim, DDP_LOG_WARN, DDP_SUB_##sub, __FILE__, __LINE__,            \
                                  __VA_ARGS__);                                                    \
    } while (0)

#endif
