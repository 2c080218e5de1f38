/* Levelled, per-subsystem logging to stderr or DDP_LOG_FILE, configured from the environment. */
#ifndef DDP_COMMON_LOG_H
#define DDP_COMMON_LOG_H

#include <stdbool.h>

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

#endif
