/*
 * Slurm's compact encodings, read by our own code (a leaf): host lists such as
 * "gpu[01-04,07]-ib,io5" (SLURM_JOB_NODELIST) and the counts of SLURM_JOB_CPUS_PER_NODE and
 * SLURM_TASKS_PER_NODE such as "2(x3),1".
 */
#ifndef DDP_CLI_HOSTLIST_H
#define DDP_CLI_HOSTLIST_H

#include <stddef.h>

#define DDP__HOSTLIST_MAX 65536 /* hosts one list may name */

/*
 * Expands a host list as Slurm does: hosts separated by commas; in a host, each bracket group
 * "[a-b,c,...]" of decimal numbers and ranges stands for each of them in turn (zero-padded to
 * the width of a range's first number, "[08-11]" is 08 09 10 11), several groups multiply
 * ("a[1-2]b[3-4]" is a1b3 a1b4 a2b3 a2b4). *out is a malloc'd array of malloc'd names, *n their
 * count. 0, or -1 with a message naming the fault in why.
 */
int ddp__hostlist_expand(const char *list, char ***out, size_t *n, char *why, size_t whyn);
void ddp__hostlist_free(char **hosts, size_t n);

/*
 * Expands a count list such as "2(x3),1" (2, 2, 2, 1) into want values: 0, or -1 with why
 * when it is malformed or does not give exactly want values.
 */
int ddp__counts_expand(const char *list, int *out, size_t want, char *why, size_t whyn);

#endif
