/*
 * A model's profile in PipeDream's graph.txt format (msr-fiddle/pipedream, graph/graph.py): one
 * line per layer,
 *   nodeN -- DESC -- forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES,
 *   parameter_size=BYTES[ -- stage_id=K[ -- replicas=R]]
 * and one tab-indented line per edge, "\tnodeA -- nodeB". An activation_size may be a list
 * "[A; B]", read as its sum (as graph.py does). replicas=R, the workers of the layer's stage, is
 * ddprun's (`ddprun pipeline plan --output` writes it; graph.py reads only the first four fields).
 */
#ifndef DDP_PIPELINE_PROFILE_H
#define DDP_PIPELINE_PROFILE_H

#include <stddef.h>
#include <stdio.h>

struct ddp_layer {
    char *id, *desc;
    double fwd_ms, bwd_ms; /* forward and backward compute time, milliseconds */
    double act_bytes;      /* the layer's output activation, bytes */
    double param_bytes;    /* its parameters, bytes */
    int stage;             /* stage_id, or -1 when the line has none */
    int replicas;          /* replicas=R, or 0 when the line has none */
    int line;              /* where it was read (1-based), 0 if made in memory */
};

struct ddp_profile {
    struct ddp_layer *layers; /* in file order */
    size_t nlayers;
    size_t (*edges)[2]; /* {from, to} layer indices, in file order */
    size_t nedges;
};

/*
 * Reads a graph.txt from text (len bytes; need not end in NUL). name is the file's name for
 * messages. On error returns DDP_EINVAL (DDP_ENOMEM) and writes "NAME:LINE:COL: what" to err;
 * p is left empty. Checks: every field, numbers finite and not negative, ids unique, edges
 * between known layers, no cycle.
 */
int ddp__profile_parse(const char *text, size_t len, const char *name, struct ddp_profile *p,
                       char *err, size_t errlen);
/* The same from a file; err names the file when it cannot be read. */
int ddp__profile_load(const char *path, struct ddp_profile *p, char *err, size_t errlen);

/* Writes p as graph.txt, as graph.py's str(Graph) does: the layers, then every layer's incoming
 * edges. Returns 0, or DDP_ESYS when the write fails. */
int ddp__profile_write(const struct ddp_profile *p, FILE *f);

/* A double as Python's repr() prints it (graph.py writes activation sizes with "%s"). */
void ddp__profile_pyfloat(double v, char *out, size_t outlen);

void ddp__profile_release(struct ddp_profile *p);

#endif
