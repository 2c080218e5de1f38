/* Rendezvous helpers built on the store client (barrier, all-gather) and job-token
 * handling. */
#include "rendezvous/store.h"
#include "rendezvous/client.h"
#include "rendezvous/store_etcd.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

#define MAX_TOKEN 4096

int ddp_store_barrier(struct ddp_store *s, const char *name, int n, int timeout_ms)
{
    char arrived[DDP_STORE_MAX_KEY + 16], done[DDP_STORE_MAX_KEY + 16];
    int64_t v;
    int r;
    if (!name || n <= 0 || strlen(name) > DDP_STORE_MAX_KEY - 16)
        return DDP_EINVAL;
    snprintf(arrived, sizeof(arrived), "%s/arrived", name);
    snprintf(done, sizeof(done), "%s/done", name);
    if ((r = ddp_store_add(s, arrived, 1, &v)) < 0)
        return r;
    if (v > n) {
        DDP_ERROR(STORE, "barrier '%s': %lld callers arrived, expected %d", name, (long long)v, n);
        return DDP_EINVAL;
    }
    /* The last arrival releases everyone with one SET; the others are parked on the server. */
    if (v == n && (r = ddp_store_set(s, done, "1", 1)) < 0)
        return r;
    const char *keys[1] = {done};
    r = ddp_store_wait(s, keys, 1, timeout_ms);
    if (r == DDP_ETIMEDOUT)
        DDP_ERROR(STORE,
                  "barrier '%s' timed out after %d ms (%lld of %d arrived when this rank did)",
                  name, timeout_ms, (long long)v, n);
    return r;
}

int ddp_store_all_gather(struct ddp_store *s, const char *prefix, int rank, int n, const void *blob,
                         size_t len, int timeout_ms, struct ddp_store_value *out)
{
    char key[DDP_STORE_MAX_KEY + 16];
    char **keys = NULL;
    int r = DDP_EINVAL;
    if (!prefix || n <= 0 || rank < 0 || rank >= n || strlen(prefix) > DDP_STORE_MAX_KEY - 16)
        return DDP_EINVAL;
    snprintf(key, sizeof(key), "%s/%d", prefix, rank);
    if ((r = ddp_store_set(s, key, blob, len)) < 0)
        return r;
    if (!(keys = calloc((size_t)n, sizeof(*keys))))
        return DDP_ENOMEM;
    r = DDP_ENOMEM;
    for (int i = 0; i < n; i++) {
        size_t kl = strlen(prefix) + 16;
        if (!(keys[i] = malloc(kl)))
            goto out;
        snprintf(keys[i], kl, "%s/%d", prefix, i);
    }
    if ((r = ddp_store_wait(s, (const char *const *)keys, (size_t)n, timeout_ms)) < 0) {
        if (r == DDP_ETIMEDOUT)
            DDP_ERROR(STORE, "all-gather '%s' timed out after %d ms waiting for %d ranks", prefix,
                      timeout_ms, n);
        goto out;
    }
    r = ddp_store_multi_get(s, (const char *const *)keys, (size_t)n, out);
out:
    for (int i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    return r;
}

int ddp_store_all_agree(struct ddp_store *s, const char *prefix, int rank, int n, bool ok,
                        int timeout_ms, bool *all)
{
    char c = ok ? '1' : '0';
    *all = false;
    struct ddp_store_value *vals = n > 0 ? calloc((size_t)n, sizeof(*vals)) : NULL;
    if (!vals)
        return n > 0 ? DDP_ENOMEM : DDP_EINVAL;
    int r = ddp_store_all_gather(s, prefix, rank, n, &c, 1, timeout_ms, vals);
    *all = r == 0;
    for (int i = 0; *all && i < n; i++)
        *all = vals[i].len == 1 && ((char *)vals[i].data)[0] == '1';
    if (r == 0)
        ddp_store_values_free(vals, (size_t)n);
    free(vals);
    return r;
}

/* ------------------------------------------------------------------ */
/* Tokens                                                             */
/* ------------------------------------------------------------------ */

int ddp_store_token_generate(char hex[DDP_STORE_TOKEN_HEX + 1])
{
    uint8_t raw[DDP_STORE_TOKEN_HEX / 2];
    static const char digits[] = "0123456789abcdef";
    int r;
    if ((r = ddp_random_bytes(raw, sizeof(raw))) < 0)
        return r;
    for (size_t i = 0; i < sizeof(raw); i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[DDP_STORE_TOKEN_HEX] = '\0';
    explicit_bzero(raw, sizeof(raw));
    return 0;
}

/* Reads at most MAX_TOKEN bytes until EOF; strips one trailing newline. */
static int read_token_fd(int fd, const char *what, uint8_t **tok, size_t *len)
{
    uint8_t *buf = malloc(MAX_TOKEN + 1);
    size_t n = 0;
    if (!buf)
        return DDP_ENOMEM;
    for (;;) {
        ssize_t r = ddp_read_eintr(fd, buf + n, MAX_TOKEN + 1 - n);
        if (r < 0) {
            DDP_ERROR(STORE, "cannot read the job token from %s: %s", what, strerror((int)-r));
            ddp_freezero(buf, MAX_TOKEN + 1);
            return DDP_EINVAL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > MAX_TOKEN) {
            DDP_ERROR(STORE, "the job token in %s is longer than %d bytes", what, MAX_TOKEN);
            ddp_freezero(buf, MAX_TOKEN + 1);
            return DDP_EINVAL;
        }
    }
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (n == 0) {
        DDP_ERROR(STORE, "the job token in %s is empty", what);
        ddp_freezero(buf, MAX_TOKEN + 1);
        return DDP_EINVAL;
    }
    *tok = buf;
    *len = n;
    return 0;
}

int ddp_store_token_read_file(const char *path, uint8_t **tok, size_t *len)
{
    char what[600];
    struct stat st;
    int r;
    if (!path)
        return DDP_EINVAL;
    snprintf(what, sizeof(what), "token file '%s'", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        DDP_ERROR(STORE, "cannot open %s: %s", what, strerror(errno));
        return DDP_EINVAL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        DDP_ERROR(STORE, "%s is not a regular file", what);
        close(fd);
        return DDP_EINVAL;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        DDP_ERROR(STORE, "%s is accessible by group or others (mode %03o); chmod 600 it", what,
                  (unsigned)(st.st_mode & 0777));
        close(fd);
        return DDP_EINVAL;
    }
    r = read_token_fd(fd, what, tok, len);
    close(fd);
    return r;
}

/* The token handed over by fd can be read only once; keep it for later connects. */
static pthread_mutex_t env_tok_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *env_tok;
static size_t env_tok_len;

int ddp_store_token_from_env(uint8_t **tok, size_t *len)
{
    int r = 0;
    pthread_mutex_lock(&env_tok_mu);
    if (!env_tok) {
        const char *fds = getenv("DDPRUN_TOKEN_FD");
        const char *file = getenv("DDPRUN_TOKEN_FILE");
        if (fds && *fds) {
            char *end;
            long fd = strtol(fds, &end, 10);
            if (*end || fd < 0 || fd > 1 << 20) {
                DDP_ERROR(STORE, "DDPRUN_TOKEN_FD='%s' is not a file descriptor", fds);
                r = DDP_EINVAL;
            } else {
                r = read_token_fd((int)fd, "DDPRUN_TOKEN_FD", &env_tok, &env_tok_len);
                close((int)fd);
                unsetenv("DDPRUN_TOKEN_FD");
            }
        } else if (file && *file) {
            r = ddp_store_token_read_file(file, &env_tok, &env_tok_len);
        } else {
            DDP_ERROR(STORE, "no job token: neither DDPRUN_TOKEN_FD nor DDPRUN_TOKEN_FILE is set");
            r = DDP_EINVAL;
        }
    }
    if (r == 0) {
        uint8_t *copy = malloc(env_tok_len);
        if (!copy) {
            r = DDP_ENOMEM;
        } else {
            memcpy(copy, env_tok, env_tok_len);
            *tok = copy;
            *len = env_tok_len;
        }
    }
    pthread_mutex_unlock(&env_tok_mu);
    return r;
}

void ddp_store_token_free(uint8_t *tok, size_t len)
{
    ddp_freezero(tok, len);
}

int ddp_store_connect_etcd(const struct ddp_store_etcd_opts *o, int timeout_ms,
                           struct ddp_store **out)
{
    struct ddp__se *se;
    int r = ddp__se_open(o->endpoints, o->prefix, o->ca, o->cert, o->key, timeout_ms, &se);
    if (r < 0)
        return r;
    if ((r = ddp__store_from_etcd(se, out)) < 0)
        ddp__se_close(se);
    return r;
}

int ddp_store_connect_env(int timeout_ms, struct ddp_store **out)
{
    const char *addr = getenv("DDPRUN_STORE_ADDR");
    char host[256];
    int port, r;
    uint8_t *tok;
    size_t toklen;
    if (!addr || !*addr) {
        DDP_ERROR(STORE, "DDPRUN_STORE_ADDR is not set (is this process running under ddprun?)");
        return DDP_EINVAL;
    }
    if (strcmp(addr, "etcd") == 0) { /* rendezvous: {backend: etcd} */
        struct ddp_store_etcd_opts o = {.endpoints = getenv("DDPRUN_ETCD_ENDPOINTS"),
                                        .prefix = getenv("DDPRUN_ETCD_PREFIX"),
                                        .ca = getenv("DDPRUN_ETCD_CA"),
                                        .cert = getenv("DDPRUN_ETCD_CERT"),
                                        .key = getenv("DDPRUN_ETCD_KEY")};
        return ddp_store_connect_etcd(&o, timeout_ms, out);
    }
    if (ddp_parse_hostport(addr, host, sizeof(host), &port) < 0 || port == 0) {
        DDP_ERROR(STORE, "DDPRUN_STORE_ADDR='%s' is not HOST:PORT", addr);
        return DDP_EINVAL;
    }
    if ((r = ddp_store_token_from_env(&tok, &toklen)) < 0)
        return r;
    r = ddp_store_connect(host, port, tok, toklen, timeout_ms, out);
    ddp_store_token_free(tok, toklen);
    return r;
}
