/* Error codes shared by every ddprun module, generated from one X-macro list. */
#ifndef DDP_COMMON_ERR_H
#define DDP_COMMON_ERR_H

/*
 * X(NAME, value, message). Values are negative and stable: they travel on the
 * store's wire protocol as the status of a reply (see man/ddprun-store.7).
 */
#define DDP_ERR_MAP(X)                                                                             \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ESYS, -3, "system call failed")                                                              \
    X(ETIMEDOUT, -4, "timed out")                                                                  \
    X(ECLOSED, -5, "connection closed by peer")                                                    \
    X(ECONNECT, -6, "cannot connect")                                                              \
    X(EPROTO, -7, "protocol error")                                                                \
    X(EAUTH, -8, "authentication failed")                                                          \
    X(ENOKEY, -9, "no such key")                                                                   \
    X(ETOOBIG, -10, "size limit exceeded")                                                         \
    X(ENOLEASE, -11, "no such lease")                                                              \
    X(ENOTINT, -12, "value is not a decimal int64")                                                \
    X(ELIMIT, -13, "server limit reached")                                                         \
    X(EVERSION, -14, "protocol version mismatch")                                                  \
    X(ENOTSUP, -15, "not supported in this build")                                                 \
    X(EABORTED, -16, "aborted")

enum ddp_err {
    DDP_OK = 0,
#define DDP__ERR_ENUM(name, val, msg) DDP_##name = (val),
    DDP_ERR_MAP(DDP__ERR_ENUM)
#undef DDP__ERR_ENUM
};

/* Message for a DDP_E* code ("unknown error" for anything else). Static storage. */
const char *ddp_strerror(int err);

/* Symbolic name ("DDP_ETIMEDOUT") for a DDP_E* code. Static storage. */
const char *ddp_err_name(int err);

#endif
