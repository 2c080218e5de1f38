/*
 * libFuzzer target for the metrics port's request heads (cli/sys/http_serve.c): any bytes get
 * one of the documented answers (more to come, 200, 400, 405, 431), and an accepted target is a
 * path of the buffer's size without its query.
 */
#include "cli/sys/http_serve.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    char *head = malloc(size + 1), target[1024];
    if (!head)
        return 0;
    memcpy(head, data, size);
    head[size] = '\0';
    bool only = false;
    int st = ddp__http_head(head, size, &only, target);
    if (st != 0 && st != 200 && st != 400 && st != 405 && st != 431)
        abort();
    if (st == 200 && (target[0] != '/' || strchr(target, '?') || strlen(target) >= sizeof(target)))
        abort();
    free(head);
    return 0;
}
