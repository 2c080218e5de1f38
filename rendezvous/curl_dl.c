/* libcurl loaded on first use (rendezvous/curl_dl.h). */
#include "rendezvous/curl_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/banned.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct ddp__curl_api api;
static const struct ddp__curl_api *loaded;
static char why_buf[512];

/* dlsym into a function pointer without converting void * to a function pointer type */
static bool sym(void *lib, const char *name, void *fp)
{
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(why_buf, sizeof(why_buf), "libcurl.so.4 has no %s", name);
        return false;
    }
    memcpy(fp, &p, sizeof(p));
    return true;
}

static void load(void)
{
    void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why_buf, sizeof(why_buf), "%s", e ? e : "cannot load libcurl.so.4");
        return;
    }
    CURLcode (*global_init)(long flags) = NULL;
    if (!sym(lib, "curl_global_init", &global_init) ||
        !sym(lib, "curl_easy_init", &api.easy_init) ||
        !sym(lib, "curl_easy_setopt", &api.easy_setopt) ||
        !sym(lib, "curl_easy_perform", &api.easy_perform) ||
        !sym(lib, "curl_easy_getinfo", &api.easy_getinfo) ||
        !sym(lib, "curl_easy_cleanup", &api.easy_cleanup) ||
        !sym(lib, "curl_easy_strerror", &api.easy_strerror))
        return; /* the library stays loaded: harmless, and dlclose of libcurl is not */
    if (global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(why_buf, sizeof(why_buf), "curl_global_init failed");
        return;
    }
    loaded = &api;
}

const struct ddp__curl_api *ddp__curl(const char **why)
{
    pthread_once(&once, load);
    if (!loaded && why)
        *why = why_buf;
    return loaded;
}
