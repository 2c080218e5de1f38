/* Small system helpers: a spin-wait hint, monotonic time, EINTR-safe IO, host:port parsing,
 * secrets. */
#ifndef DDP_COMMON_UTIL_H
#define DDP_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The CPU's spin-wait hint (pause, yield), for a loop polling memory another core writes. */
static inline void ddp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Milliseconds / nanoseconds on CLOCK_MONOTONIC. */
int64_t ddp_now_ms(void);
int64_t ddp_now_ns(void);

/* read/write retried on EINTR; a negative return is -errno. */
ssize_t ddp_read_eintr(int fd, void *p, size_t n);
ssize_t ddp_write_eintr(int fd, const void *p, size_t n);
/* Writes all n bytes (blocking fd). DDP_ESYS on failure. */
int ddp_write_all(int fd, const void *p, size_t n);

/* Splits "host:port" or "[v6]:port". host gets a NUL-terminated copy. DDP_EINVAL if malformed. */
int ddp_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

/* Fills p with n bytes from the kernel CSPRNG. DDP_ESYS on failure. */
int ddp_random_bytes(void *p, size_t n);

/* Zeroes memory in a way the compiler cannot drop, then frees it. NULL is a no-op. */
void ddp_freezero(void *p, size_t n);

/* Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit. */
long ddp_raise_nofile(void);
/* Puts back the soft limit ddp_raise_nofile raised (nothing if it did not): for a child that
 * runs a user's program, which gets the limits its user gave ddprun (as under torchrun). */
void ddp_restore_nofile(void);

/* The length of s's longest prefix of at most max bytes that ends between UTF-8 characters. */
size_t ddp_utf8_prefix(const char *s, size_t max);

#endif
