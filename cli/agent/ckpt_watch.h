/*
 * The files the ranks finish in a node-local checkpoint folder, as the node's agent sees them
 * (cli/agent/ckpt_watch.c), for the checkpoints the agents replicate (cli/agent/ckpt_repl.h).
 *
 * Through inotify, in the folder and every folder below it (those made after the watch began
 * too): a file closed after writing, or renamed into place, is FINISHED once nothing touched it
 * for settle_ms (so that the temporary file of a write-then-rename is never reported, only the
 * name it ends under); a file that was reported and is gone (deleted, renamed away) is REMOVED.
 * Where the kernel's queue overflowed, the whole tree is read again: what changed is reported as
 * above. Regular files only; symbolic links and other kinds are not followed.
 */
#ifndef DDP_CLI_AGENT_CKPT_WATCH_H
#define DDP_CLI_AGENT_CKPT_WATCH_H

#include <stdbool.h>
#include <stdint.h>

struct ddp_loop;
struct ddp__cw;

enum ddp__cw_kind { DDP__CW_FINISHED, DDP__CW_REMOVED };

/* rel: the file's path under the folder ("step-10/model.pt"), without a leading '/'. */
typedef void (*ddp__cw_fn)(void *arg, enum ddp__cw_kind kind, const char *rel);

/* Watches dir on loop; existing: the files already there are reported FINISHED too (at the
 * first settle). 0 and *out, or -errno (ENOENT: no such folder; ENOSPC: the system's inotify
 * watches are used up). */
int ddp__cw_open(struct ddp_loop *loop, const char *dir, int64_t settle_ms, bool existing,
                 ddp__cw_fn fn, void *arg, struct ddp__cw **out);
void ddp__cw_close(struct ddp__cw *w);
/* Something the kernel or the settle wait still holds: events unread, or a file not settled. */
bool ddp__cw_busy(const struct ddp__cw *w);

/* A file's size and SHA-256, read in one pass. 0, or -errno. */
int ddp__cw_hash(const char *path, uint64_t *size, uint8_t sha256[32]);

#endif
