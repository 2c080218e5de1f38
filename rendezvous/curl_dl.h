/*
 * libcurl, loaded when the first etcd client is made (dlopen of libcurl.so.4) instead of linked:
 * its dependencies (HTTP/2, IDN, LDAP, Kerberos, GnuTLS, ...: 21 shared objects on Debian 12)
 * cost every process that links libddp about 3 ms at exec, and only etcd rendezvous uses it.
 * Types and constants still come from <curl/curl.h>.
 */
#ifndef DDP_RENDEZVOUS_CURL_DL_H
#define DDP_RENDEZVOUS_CURL_DL_H

#include <curl/curl.h>

struct ddp__curl_api {
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *c, CURLoption opt, ...);
    CURLcode (*easy_perform)(CURL *c);
    CURLcode (*easy_getinfo)(CURL *c, CURLINFO info, ...);
    void (*easy_cleanup)(CURL *c);
    const char *(*easy_strerror)(CURLcode code);
};

/* The API, loaded and globally initialised once (thread-safe); NULL when libcurl cannot be
 * loaded, with why (dlerror's words, static) in *why when why is not NULL. */
const struct ddp__curl_api *ddp__curl(const char **why);

#endif
