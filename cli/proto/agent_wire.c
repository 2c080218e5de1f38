/* The agent link's transport: handshake, sealed records, BOOT and ATTACH (agent_wire.h). */
#include "cli/proto/agent_wire.h"
#include "cli/proto/agent_proto.h"
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/proto.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define MAGIC "DDPA"
#define L_CLIENT "ddprun-agent-v1 client"
#define L_SERVER "ddprun-agent-v1 server"
#define L_A2L "ddprun-agent-v1 key a2l" /* labels: 32 bytes at most */
#define L_L2A "ddprun-agent-v1 key l2a"

/* ---- BOOT and ATTACH ---- */

int ddp__aw_get_string(struct ddp_rd *r, char *out, size_t n, bool printable)
{
    const uint8_t *p;
    uint32_t l;
    if (ddp_rd_str(r, (uint32_t)(n - 1), &p, &l) < 0)
        return DDP_EPROTO;
    for (uint32_t k = 0; k < l; k++)
        if (!p[k] || (printable && (p[k] < 0x21 || p[k] > 0x7e)))
            return DDP_EPROTO;
    memcpy(out, p, l);
    out[l] = '\0';
    return 0;
}

int ddp__aw_put_boot(struct ddp_buf *b, const struct ddp__aw_boot *x)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_BOOT);
    ddp_buf_put_str(b, x->token, strlen(x->token));
    ddp_buf_put_str(b, x->addrs, strlen(x->addrs));
    ddp_buf_put_u32(b, x->node);
    ddp_buf_put_str(b, x->ticket, strlen(x->ticket));
    if (x->flags)
        ddp_buf_put_u8(b, x->flags);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__aw_get_boot(const uint8_t *body, size_t len, struct ddp__aw_boot *x)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp__aw_get_string(&r, x->token, sizeof(x->token), true) < 0 ||
        ddp__aw_get_string(&r, x->addrs, sizeof(x->addrs), true) < 0 ||
        ddp_rd_u32(&r, &x->node) < 0 ||
        ddp__aw_get_string(&r, x->ticket, sizeof(x->ticket), true) < 0 || !x->token[0] ||
        !x->addrs[0])
        return DDP_EPROTO;
    x->flags = 0; /* optional: a BOOT without flags has none */
    if (ddp_rd_left(&r) && (ddp_rd_u8(&r, &x->flags) < 0 || !x->flags ||
                            (x->flags & ~DDP__AW_BOOT_BELOW) || ddp_rd_left(&r)))
        return DDP_EPROTO;
    return 0;
}

size_t ddp__aw_group_begin(struct ddp_buf *b, const char *token)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_BOOT_GROUP);
    ddp_buf_put_str(b, token, strlen(token));
    ddp_buf_put_u32(b, 0);
    return pos;
}

void ddp__aw_group_add(struct ddp_buf *b, const char *host, uint32_t node, const char *ticket,
                       const char *addrs)
{
    ddp_buf_put_str(b, host, strlen(host));
    ddp_buf_put_u32(b, node);
    ddp_buf_put_str(b, ticket, strlen(ticket));
    ddp_buf_put_str(b, addrs, strlen(addrs));
}

void ddp__aw_group_end(struct ddp_buf *b, size_t pos, uint32_t n)
{
    /* the count follows the frame's header (5 bytes) and the token (4 + its length) */
    const uint8_t *f = b->data + b->off + pos; /* ddp__agent_begin's position */
    uint32_t tl =
        (uint32_t)f[5] | (uint32_t)f[6] << 8 | (uint32_t)f[7] << 16 | (uint32_t)f[8] << 24;
    ddp_buf_patch_u32(b, b->off + pos + 9 + tl, n);
    ddp__agent_end(b, pos);
}

int ddp__aw_get_boot_group(const uint8_t *body, size_t len, const char *host,
                           struct ddp__aw_boot *x)
{
    struct ddp_rd r;
    uint32_t n;
    int found = 1;
    x->flags = 0;
    ddp_rd_init(&r, body, len);
    if (ddp__aw_get_string(&r, x->token, sizeof(x->token), true) < 0 || !x->token[0] ||
        ddp_rd_u32(&r, &n) < 0)
        return DDP_EPROTO;
    for (uint32_t k = 0; k < n; k++) {
        char h[256];
        struct ddp__aw_boot e;
        if (ddp__aw_get_string(&r, h, sizeof(h), true) < 0 || ddp_rd_u32(&r, &e.node) < 0 ||
            ddp__aw_get_string(&r, e.ticket, sizeof(e.ticket), true) < 0 ||
            ddp__aw_get_string(&r, e.addrs, sizeof(e.addrs), true) < 0 || !e.addrs[0])
            return DDP_EPROTO;
        if (found && strcmp(h, host) == 0) {
            found = 0;
            x->node = e.node;
            memcpy(x->ticket, e.ticket, sizeof(x->ticket));
            memcpy(x->addrs, e.addrs, sizeof(x->addrs));
        }
    }
    return ddp_rd_left(&r) ? DDP_EPROTO : found;
}

int ddp__aw_put_attach(struct ddp_buf *b, const struct ddp__aw_attach *x)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_ATTACH);
    ddp_buf_put_u8(b, x->kind);
    ddp_buf_put_u32(b, x->node);
    ddp_buf_put_str(b, x->name, strlen(x->name));
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__aw_get_attach(const uint8_t *body, size_t len, struct ddp__aw_attach *x)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u8(&r, &x->kind) < 0 || ddp_rd_u32(&r, &x->node) < 0 ||
        ddp__aw_get_string(&r, x->name, sizeof(x->name), true) < 0 || ddp_rd_left(&r) ||
        (x->kind != DDP__AW_PROVISIONED && x->kind != DDP__AW_EXTERNAL) || !x->name[0])
        return DDP_EPROTO;
    return 0;
}

/* ---- the handshake ---- */

static int mac(const char *token, const char *label, const uint8_t *a, const uint8_t *b,
               uint8_t out[DDP__AW_MAC])
{
    /* HMAC-SHA256(token, label || a || b), a and b nonces of DDP__AW_NONCE bytes: the store's
     * construction (rendezvous/proto.c) under this link's own labels. */
    return ddp__proto_mac((const uint8_t *)token, strlen(token), label, a, b, out);
}

int ddp__aw_c1(uint8_t out[DDP__AW_C1_LEN], uint8_t cnonce[DDP__AW_NONCE])
{
    if (ddp_random_bytes(cnonce, DDP__AW_NONCE) < 0)
        return DDP_EAUTH;
    memcpy(out, MAGIC, 4);
    uint32_t v = DDP__AW_VERSION;
    for (int k = 0; k < 4; k++)
        out[4 + k] = (uint8_t)(v >> (8 * k));
    memcpy(out + 8, cnonce, DDP__AW_NONCE);
    return 0;
}

int ddp__aw_s1(const char *token, const uint8_t c1[DDP__AW_C1_LEN], uint8_t cnonce[DDP__AW_NONCE],
               uint8_t snonce[DDP__AW_NONCE], uint8_t out[DDP__AW_S1_LEN])
{
    if (memcmp(c1, MAGIC, 4) != 0)
        return DDP_EPROTO;
    uint32_t v =
        (uint32_t)c1[4] | (uint32_t)c1[5] << 8 | (uint32_t)c1[6] << 16 | (uint32_t)c1[7] << 24;
    if (v != DDP__AW_VERSION)
        return DDP_EVERSION;
    memcpy(cnonce, c1 + 8, DDP__AW_NONCE);
    if (ddp_random_bytes(snonce, DDP__AW_NONCE) < 0)
        return DDP_EAUTH;
    memcpy(out, MAGIC, 4);
    memcpy(out + 4, snonce, DDP__AW_NONCE);
    return mac(token, L_SERVER, cnonce, snonce, out + 4 + DDP__AW_NONCE);
}

int ddp__aw_c2(const char *token, const uint8_t cnonce[DDP__AW_NONCE],
               const uint8_t s1[DDP__AW_S1_LEN], uint8_t snonce[DDP__AW_NONCE],
               uint8_t out[DDP__AW_C2_LEN])
{
    uint8_t want[DDP__AW_MAC];
    if (memcmp(s1, MAGIC, 4) != 0)
        return DDP_EPROTO;
    memcpy(snonce, s1 + 4, DDP__AW_NONCE);
    if (mac(token, L_SERVER, cnonce, snonce, want) < 0 ||
        !ddp__proto_mac_equal(want, s1 + 4 + DDP__AW_NONCE))
        return DDP_EAUTH;
    return mac(token, L_CLIENT, snonce, cnonce, out);
}

int ddp__aw_check_c2(const char *token, const uint8_t cnonce[DDP__AW_NONCE],
                     const uint8_t snonce[DDP__AW_NONCE], const uint8_t c2[DDP__AW_C2_LEN])
{
    uint8_t want[DDP__AW_MAC];
    if (mac(token, L_CLIENT, snonce, cnonce, want) < 0 || !ddp__proto_mac_equal(want, c2))
        return DDP_EAUTH;
    return 0;
}

/* ---- sealed records ---- */

int ddp__seal_init(struct ddp__seal *s, const char *token, const uint8_t cnonce[DDP__AW_NONCE],
                   const uint8_t snonce[DDP__AW_NONCE], bool agent)
{
    uint8_t a2l[32], l2a[32];
    memset(s, 0, sizeof(*s));
    if (mac(token, L_A2L, cnonce, snonce, a2l) < 0 || mac(token, L_L2A, cnonce, snonce, l2a) < 0)
        return DDP_EAUTH;
    memcpy(s->ktx, agent ? a2l : l2a, 32);
    memcpy(s->krx, agent ? l2a : a2l, 32);
    explicit_bzero(a2l, sizeof(a2l));
    explicit_bzero(l2a, sizeof(l2a));
    s->on = true;
    return 0;
}

void ddp__seal_wipe(struct ddp__seal *s)
{
    explicit_bzero(s, sizeof(*s));
}

static void nonce_of(uint64_t n, uint8_t iv[12])
{
    memset(iv, 0, 12);
    for (int k = 0; k < 8; k++)
        iv[4 + k] = (uint8_t)(n >> (8 * k));
}

/* One AES-256-GCM operation: enc seals in into out and writes tag; else opens in into out,
 * checking tag. aad is the record's 4 length bytes. */
static int gcm(bool enc, const uint8_t key[32], uint64_t n, const uint8_t aad[4], const uint8_t *in,
               size_t len, uint8_t *out, uint8_t tag[DDP__AW_TAG])
{
    uint8_t iv[12];
    nonce_of(n, iv);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int ol = 0, ok = c != NULL;
    ok = ok && (enc ? EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv)
                    : EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv)) == 1;
    ok = ok && (enc ? EVP_EncryptUpdate(c, NULL, &ol, aad, 4)
                    : EVP_DecryptUpdate(c, NULL, &ol, aad, 4)) == 1;
    ok = ok && (enc ? EVP_EncryptUpdate(c, out, &ol, in, (int)len)
                    : EVP_DecryptUpdate(c, out, &ol, in, (int)len)) == 1;
    if (ok && enc)
        ok = EVP_EncryptFinal_ex(c, out + ol, &ol) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, DDP__AW_TAG, tag) == 1;
    else if (ok)
        ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, DDP__AW_TAG, tag) == 1 &&
             EVP_DecryptFinal_ex(c, out + ol, &ol) == 1;
    EVP_CIPHER_CTX_free(c);
    return ok ? 0 : DDP_EAUTH;
}

int ddp__seal_put(struct ddp__seal *s, const void *p, size_t n, struct ddp_buf *out)
{
    const uint8_t *in = p;
    while (n > 0) {
        size_t m = n < DDP__AW_MAX_RECORD ? n : DDP__AW_MAX_RECORD;
        if (ddp_buf_reserve(out, 4 + m + DDP__AW_TAG) < 0)
            return DDP_ENOMEM;
        uint8_t *r = out->data + out->len;
        for (int k = 0; k < 4; k++)
            r[k] = (uint8_t)((uint32_t)m >> (8 * k));
        if (gcm(true, s->ktx, s->ntx, r, in, m, r + 4, r + 4 + m) < 0)
            return DDP_EAUTH;
        s->ntx++;
        out->len += 4 + m + DDP__AW_TAG;
        in += m;
        n -= m;
    }
    return 0;
}

int ddp__seal_open(struct ddp__seal *s, struct ddp_buf *raw, struct ddp_buf *plain)
{
    while (ddp_buf_pending(raw) >= 4) {
        const uint8_t *r = raw->data + raw->off;
        uint32_t m =
            (uint32_t)r[0] | (uint32_t)r[1] << 8 | (uint32_t)r[2] << 16 | (uint32_t)r[3] << 24;
        if (m < 1 || m > DDP__AW_MAX_RECORD)
            return DDP_EPROTO;
        if (ddp_buf_pending(raw) < 4 + (size_t)m + DDP__AW_TAG)
            break;
        if (ddp_buf_reserve(plain, m) < 0)
            return DDP_ENOMEM;
        uint8_t tag[DDP__AW_TAG];
        memcpy(tag, r + 4 + m, DDP__AW_TAG);
        if (gcm(false, s->krx, s->nrx, r, r + 4, m, plain->data + plain->len, tag) < 0)
            return DDP_EAUTH;
        s->nrx++;
        plain->len += m;
        raw->off += 4 + (size_t)m + DDP__AW_TAG;
    }
    ddp_buf_compact(raw);
    return 0;
}

int ddp__aw_write(int fd, struct ddp__seal *s, const void *p, size_t n)
{
    if (!s || !s->on)
        return ddp_write_all(fd, p, n);
    struct ddp_buf b;
    ddp_buf_init(&b);
    int r = ddp__seal_put(s, p, n, &b);
    if (r == 0)
        r = ddp_write_all(fd, b.data, b.len);
    ddp_buf_release(&b);
    return r;
}

/* ---- dialing ---- */

/* Waits for fd to be ready for ev before deadline: 0, or -1 with *err. */
static int wait_fd(int fd, short ev, int64_t deadline, int *err)
{
    for (;;) {
        int64_t left = deadline - ddp_now_ms();
        if (left <= 0) {
            *err = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, (int)left);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR) {
            *err = errno;
            return -1;
        }
    }
}

static int read_exact(int fd, uint8_t *p, size_t n, int64_t deadline, int *err)
{
    while (n > 0) {
        if (wait_fd(fd, POLLIN, deadline, err) < 0)
            return -1;
        ssize_t r = ddp_read_eintr(fd, p, n);
        if (r == -EAGAIN)
            continue;
        if (r <= 0) {
            *err = r == 0 ? ECONNRESET : (int)-r;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int connect_one(const struct addrinfo *ai, int64_t deadline, int *err)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int e = errno;
        socklen_t el = sizeof(e);
        if (e != EINPROGRESS || wait_fd(fd, POLLOUT, deadline, err) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0) {
            if (e != EINPROGRESS)
                *err = e;
            close(fd);
            return -1;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Dials one host:port and runs the handshake: the fd, or -1 with what happened in why. */
static int dial_one(const char *addr, const char *token, int timeout_ms, struct ddp__seal *s,
                    char *why, size_t whyn)
{
    char host[256];
    int port, err = 0;
    if (ddp_parse_hostport(addr, host, sizeof(host), &port) < 0) {
        snprintf(why, whyn, "not HOST:PORT");
        return -1;
    }
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(why, whyn, "%s", gai_strerror(g));
        return -1;
    }
    int64_t deadline = ddp_now_ms() + timeout_ms;
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = connect_one(ai, deadline, &err);
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(why, whyn, "%s", strerror(err ? err : ECONNREFUSED));
        return -1;
    }
    uint8_t c1[DDP__AW_C1_LEN], s1[DDP__AW_S1_LEN], c2[DDP__AW_C2_LEN];
    uint8_t cn[DDP__AW_NONCE], sn[DDP__AW_NONCE];
    int r;
    if (ddp__aw_c1(c1, cn) < 0 || ddp_write_all(fd, c1, sizeof(c1)) < 0 ||
        read_exact(fd, s1, sizeof(s1), deadline, &err) < 0) {
        snprintf(why, whyn, "%s", err ? strerror(err) : "cannot send");
        if (err == ECONNRESET)
            snprintf(why, whyn,
                     "it closed the connection (not a ddprun launcher, or it refused us)");
        close(fd);
        return -1;
    }
    if ((r = ddp__aw_c2(token, cn, s1, sn, c2)) < 0) {
        snprintf(why, whyn, "%s",
                 r == DDP_EPROTO ? "it is not a ddprun launcher's agent port"
                                 : "it did not prove the job's token (another job's launcher?)");
        close(fd);
        return -1;
    }
    if (ddp_write_all(fd, c2, sizeof(c2)) < 0 || ddp__seal_init(s, token, cn, sn, true) < 0) {
        snprintf(why, whyn, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

int ddp__aw_dial_one(const char *addr, const char *token, int timeout_ms, struct ddp__seal *s,
                     char *why, size_t whyn)
{
    return dial_one(addr, token, timeout_ms, s, why, whyn);
}

int ddp__aw_accept(int fd, const char *token, int timeout_ms, struct ddp__seal *s, char *why,
                   size_t whyn)
{
    uint8_t c1[DDP__AW_C1_LEN], s1[DDP__AW_S1_LEN], c2[DDP__AW_C2_LEN];
    uint8_t cn[DDP__AW_NONCE], sn[DDP__AW_NONCE];
    int64_t deadline = ddp_now_ms() + timeout_ms;
    int err = 0;
    if (read_exact(fd, c1, sizeof(c1), deadline, &err) < 0) {
        snprintf(why, whyn, "%s",
                 err == ETIMEDOUT ? "it sent no handshake in time" : strerror(err));
        return -1;
    }
    if (ddp__aw_s1(token, c1, cn, sn, s1) < 0) {
        snprintf(why, whyn, "it did not begin a ddprun handshake");
        return -1;
    }
    if (ddp_write_all(fd, s1, sizeof(s1)) < 0 ||
        read_exact(fd, c2, sizeof(c2), deadline, &err) < 0) {
        snprintf(why, whyn, "%s",
                 err == ETIMEDOUT ? "it did not finish the handshake in time"
                 : err            ? strerror(err)
                                  : "cannot send");
        return -1;
    }
    if (ddp__aw_check_c2(token, cn, sn, c2) < 0) {
        snprintf(why, whyn, "it did not prove the job's token");
        return -1;
    }
    if (ddp__seal_init(s, token, cn, sn, false) < 0) {
        snprintf(why, whyn, "cannot derive the keys");
        return -1;
    }
    return 0;
}

int ddp__aw_dial(const char *addrs, const char *token, const struct ddp__aw_attach *att,
                 int timeout_ms, int *fd, struct ddp__seal *s, char *why, size_t whyn)
{
    char list[DDP__AW_ADDRS_MAX];
    snprintf(list, sizeof(list), "%s", addrs);
    size_t wl = 0;
    why[0] = '\0';
    char *save = NULL;
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        char one[300];
        int c = dial_one(a, token, timeout_ms, s, one, sizeof(one));
        if (c >= 0) {
            struct ddp_buf b;
            ddp_buf_init(&b);
            int r = ddp__aw_put_attach(&b, att);
            if (r == 0)
                r = ddp__aw_write(c, s, b.data, b.len);
            ddp_buf_release(&b);
            if (r == 0) {
                *fd = c;
                return 0;
            }
            snprintf(one, sizeof(one), "it closed the connection after the handshake");
            close(c);
            ddp__seal_wipe(s);
        }
        if (wl < whyn) {
            int w = snprintf(why + wl, whyn - wl, "%s%s (%s)", wl ? ", " : "", a, one);
            wl += w > 0 ? (size_t)w : 0;
        }
    }
    if (!why[0])
        snprintf(why, whyn, "no address given");
    return -1;
}
