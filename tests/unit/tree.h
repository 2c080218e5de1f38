/* Folder trees under /tmp for unit tests that read files a kernel would provide (sysfs, cgroup
 * files): made, written, removed. Any failure aborts the test. */
#ifndef DDP_TESTS_UNIT_TREE_H
#define DDP_TESTS_UNIT_TREE_H

#include <stddef.h>

/* root = a new folder /tmp/NAME-XXXXXX (len: root's size). */
void ddp_tree_make(char *root, size_t len, const char *name);
/* root/rel = text and a newline, its folders made. */
void ddp_tree_put(const char *root, const char *rel, const char *text);
void ddp_tree_remove(const char *root);

#endif
