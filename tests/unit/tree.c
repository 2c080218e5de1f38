/* Folder trees for unit tests (tree.h). */
#include "tree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ddp_tree_make(char *root, size_t len, const char *name)
{
    snprintf(root, len, "/tmp/%s-XXXXXX", name);
    if (!mkdtemp(root))
        abort();
}

void ddp_tree_put(const char *root, const char *rel, const char *text)
{
    char path[512], dir[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *p = strchr(path + strlen(root) + 1, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(dir, sizeof(dir), "%.*s", (int)(p - path), path);
        mkdir(dir, 0755);
    }
    FILE *f = fopen(path, "w");
    if (!f)
        abort();
    fprintf(f, "%s\n", text);
    fclose(f);
}

void ddp_tree_remove(const char *root)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        abort();
}
