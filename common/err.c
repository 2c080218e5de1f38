/* String tables for the DDP_E* codes, produced from the same X-macro as the enum. */
#include "common/err.h"

#include "common/banned.h"

const char *ddp_strerror(int err)
{
    switch (err) {
    case DDP_OK:
        return "success";
#define DDP__ERR_MSG(name, val, msg)                                                               \
    case DDP_##name:                                                                               \
        return msg;
        DDP_ERR_MAP(DDP__ERR_MSG)
#undef DDP__ERR_MSG
    }
    return "unknown error";
}

const char *ddp_err_name(int err)
{
    switch (err) {
    case DDP_OK:
        return "DDP_OK";
#define DDP__ERR_NAME(name, val, msg)                                                              \
    case DDP_##name:                                                                               \
        return "DDP_" #name;
        DDP_ERR_MAP(DDP__ERR_NAME)
#undef DDP__ERR_NAME
    }
    return "DDP_E?";
}
