/* torchrun's TORCHELASTIC_ERROR_FILE, on the agent's side (cli/agent/errfile.h). */
#include "cli/agent/errfile.h"
#include "cli/proto/agent_proto.h"
#include "common/json.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/banned.h"

#define FILE_MAX (1u << 20) /* torch writes a few KiB; more than this is not read */

int ddp__ef_new(void)
{
    return memfd_create("ddprun-error-file", MFD_CLOEXEC);
}

void ddp__ef_path(int fd, pid_t agent, char *buf, size_t n)
{
    snprintf(buf, n, "/proc/%d/fd/%d", (int)agent, fd);
}

/* The string at tok, unescaped, cut to max bytes when longer, at a UTF-8 character's start:
 * its first ones, or its last (tail: the end of a traceback is where it failed); NULL when tok
 * is not a string. */
static char *str_cut(const struct ddp_json *j, int tok, size_t max, bool tail)
{
    if (tok < 0 || j->tok[tok].type != DDP_J_STRING)
        return NULL;
    size_t cap = (size_t)(j->tok[tok].end - j->tok[tok].start) + 1; /* unescaping only shrinks */
    char *s = malloc(cap);
    if (!s || ddp_json_str(j, tok, s, cap) < 0) {
        free(s);
        return NULL;
    }
    size_t n = strlen(s), k;
    if (n > max && tail) {
        for (k = n - max; k < n && (s[k] & 0xc0) == 0x80; k++) /* not inside a character */
            ;
        memmove(s, s + k, n - k + 1);
    } else if (n > max) {
        for (k = max; k > 0 && (s[k] & 0xc0) == 0x80; k--)
            ;
        s[k] = '\0';
    }
    return s;
}

bool ddp__ef_frame(int fd, uint32_t local_rank, struct ddp_buf *out)
{
    if (fd < 0)
        return false;
    char *text = malloc(FILE_MAX);
    size_t len = 0;
    while (text && len < FILE_MAX) {
        ssize_t r = pread(fd, text + len, FILE_MAX - len, (off_t)len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    struct ddp_json j = {0};
    bool sent = false;
    if (text && len > 0 && len < FILE_MAX && ddp_json_parse(text, len, &j) == 0 &&
        j.tok[0].type == DDP_J_OBJECT) {
        /* {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}}, or (torch's
         * newer form) {"message": "..."} */
        int m = ddp_json_get(&j, 0, "message");
        int mm = m >= 0 && j.tok[m].type == DDP_J_OBJECT ? ddp_json_get(&j, m, "message") : m;
        const char *const cs[] = {"extraInfo", "py_callstack", NULL};
        int tb = m >= 0 && j.tok[m].type == DDP_J_OBJECT ? ddp_json_path(&j, m, cs) : -1;
        char *msg = str_cut(&j, mm, DDP__EF_MESSAGE_MAX, false),
             *trace = str_cut(&j, tb, DDP__EF_TRACEBACK_MAX, true);
        if (msg && msg[0]) {
            size_t pos = ddp__agent_begin(out, DDP__AG_ERROR);
            ddp_buf_put_u32(out, local_rank);
            ddp_buf_put_str(out, msg, strlen(msg));
            ddp_buf_put_str(out, trace ? trace : "", trace ? strlen(trace) : 0);
            ddp__agent_end(out, pos);
            sent = true;
        }
        free(msg);
        free(trace);
    }
    ddp_json_free(&j);
    free(text);
    return sent;
}
