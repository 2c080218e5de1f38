/*
 * What the Fashion-MNIST trainers share: options, the dataset, the seeded generator and
 * shuffle, weight initialisation and the final parameter dump/compare. ddprun-fmnist keeps its
 * tensors in host memory (OpenBLAS), ddprun-fmnist-cuda on a GPU (cuBLAS and small kernels);
 * both make the same reducer calls.
 */
#include "examples/fmnist/common.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <zlib.h>

int rank = 0, world = 1;
const char *prog = "ddprun-fmnist";

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s rank %d: ", prog, rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* splitmix64: the seeded generator for initialisation and shuffles (same on every rank). */
uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void shuffle(int *perm, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(mix(&seed) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- data: the IDX files of Debian's dataset-fashion-mnist ---- */

/* Memory of len bytes for a dataset file, in huge pages where the kernel has them (madvise):
 * the training images are 47 MB, which every rank would otherwise fault in 4 KiB at a time. */
static void *big_alloc(size_t len)
{
    void *p = NULL;
    size_t huge = (size_t)2 << 20;
    if (posix_memalign(&p, huge, (len + huge - 1) / huge * huge) != 0)
        return NULL;
    madvise(p, (len + huge - 1) / huge * huge, MADV_HUGEPAGE); /* a hint: may fail */
    return p;
}

/* The uncompressed size a gzip file's trailer gives (modulo 4 GiB; of its last member only),
 * as the first guess of the buffer to read it into; 0 if it cannot be read. */
static size_t gz_size_hint(const char *path)
{
    uint8_t t[4];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    bool ok = fseek(f, -4, SEEK_END) == 0 && fread(t, 1, 4, f) == 4;
    fclose(f);
    return ok ? (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24 : 0;
}

static void *read_gz(const char *dir, const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    gzFile f = gzopen(path, "rb");
    if (!f)
        die("cannot open %s: %s (install Debian's dataset-fashion-mnist, or pass --data DIR)", path,
            strerror(errno));
    gzbuffer(f, 1 << 17);
    /* one byte beyond the trailer's size, so that a read to the end needs no second buffer;
     * a damaged file's trailer may say anything: then it grows from 1 MiB */
    size_t cap = gz_size_hint(path) + 1, n = 0;
    if (cap < (1 << 20) || cap > (1u << 30))
        cap = 1 << 20;
    char *buf = big_alloc(cap);
    if (!buf && cap > (1 << 20))
        buf = big_alloc(cap = 1 << 20);
    if (!buf)
        die("out of memory reading %s", path);
    for (;;) {
        if (n == cap) {
            char *more = big_alloc(cap * 2);
            if (!more)
                die("out of memory reading %s", path);
            memcpy(more, buf, n);
            free(buf);
            buf = more;
            cap *= 2;
        }
        size_t want = cap - n > (1u << 30) ? (1u << 30) : cap - n;
        int r = gzread(f, buf + n, (unsigned)want);
        if (r < 0)
            die("%s is not a readable gzip file", path);
        if (r == 0)
            break;
        n += (size_t)r;
    }
    gzclose(f);
    *len = n;
    return buf;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void load_set(const char *dir, const char *images, const char *labels, struct dataset *d)
{
    size_t il, ll;
    uint8_t *im = read_gz(dir, images, &il), *lb = read_gz(dir, labels, &ll);
    if (il < 16 || be32(im) != 0x803 || be32(im + 8) != 28 || be32(im + 12) != 28)
        die("%s/%s is not an IDX file of 28x28 images", dir, images);
    if (ll < 8 || be32(lb) != 0x801)
        die("%s/%s is not an IDX label file", dir, labels);
    uint32_t n = be32(im + 4);
    if (be32(lb + 4) != n || il != 16 + (size_t)n * IMG || ll != 8 + (size_t)n)
        die("%s: %s and %s disagree or are truncated", dir, images, labels);
    d->n = (int)n;
    d->raw = im;
    d->px = im + 16;
    d->y = malloc(n);
    if (!d->y)
        die("out of memory reading %s/%s", dir, labels);
    /* The dataset's mean and standard deviation of pixel values. */
    for (int v = 0; v < 256; v++)
        d->norm[v] = ((float)v / 255.0f - 0.2860f) / 0.3530f;
    for (uint32_t i = 0; i < n; i++) {
        if (lb[8 + i] >= CLASSES)
            die("%s/%s: label %u out of range", dir, labels, lb[8 + i]);
        d->y[i] = lb[8 + i];
    }
    free(lb);
}

void free_set(struct dataset *d)
{
    free(d->raw);
    free(d->y);
}

void set_rows(const struct dataset *d, int first, int count, float *out)
{
    const uint8_t *p = d->px + (size_t)first * IMG;
    for (size_t i = 0; i < (size_t)count * IMG; i++)
        out[i] = d->norm[p[i]];
}

int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

void usage(FILE *f)
{
    fprintf(
        f,
        "usage: %s [options]\n"
        "  --epochs N          epochs (default 3)\n"
        "  --batch B           global batch size, split over the ranks (default 64)\n"
        "  --hidden A,B,...    hidden layer widths (default 256,128)\n"
        "  --lr X --momentum X SGD with momentum (default 0.02, 0.9)\n"
        "  --seed N            initialisation and shuffle seed (default 1)\n"
        "  --data DIR          Fashion-MNIST IDX files (default "
        "/usr/share/datasets/fashion-mnist)\n"
        "  --checkpoint-dir D  resume from and save to D (default $DDPRUN_CHECKPOINT_DIR)\n"
        "  --checkpoint-every N  also checkpoint every N steps (default: each epoch)\n"
        "  --max-steps N       stop after N global steps in total\n"
        "  --eval-every N      evaluate every N epochs and at the end (default 1; 0 = never)\n"
        "  --no-ddp            no process group: each rank trains its shard alone (compute only)\n"
        "  --simulate-ranks N  no process group: one process computes every step as N ranks on\n"
        "                      one node do, shard by shard, and averages their gradients in the\n"
        "                      order and arithmetic of libddp's shared-memory all-reduce (a\n"
        "                      bit-exact reference for a data-parallel run)\n"
        "  --bucket-view       gradients live in the reducer's buckets\n"
        "  --no-overlap        all-reduce everything after backward\n"
        "  --bucket-mb X --first-bucket-mb X  bucket caps (default 25, 1; 0 = per tensor)\n"
        "  --hook fp16|bf16    compress buckets\n"
        "  --bench             print the median step time and reducer statistics\n"
        "  --bench-paired      --bench, and beside each step the same step without the\n"
        "                      reducer (compute only: after it, or before it on odd steps)\n"
        "                      and a bare all-reduce of all the gradients (registered\n"
        "                      memory, as the buckets are), timed pair by\n"
        "                      pair, and both steps' phases (a benchmark, not training)\n"
        "  --bench-view-copy   --bench with two reducers on the same parameters, one with\n"
        "                      --bucket-view and one without, used on alternate steps:\n"
        "                      each mode's medians and copy / view, pair by pair\n"
        "  --dump FILE         write the final parameters (rank 0)\n"
        "  --compare FILE      compare the final parameters with FILE (--tol, default 1e-4)\n"
        "  --profile-graph FILE  time each layer's forward and backward at a minibatch of\n"
        "                      --batch, write PipeDream's graph.txt (for ddprun pipeline plan)\n"
        "                      and exit\n"
        "  --pipeline A,B,...  train as a pipeline (ddp_pipe(3)): stage s has the next A, B, ...\n"
        "                      layers (hidden layers + output in all); under ddprun\n"
        "  --replicas R,...    ranks per stage (default 1 each; they add up to WORLD_SIZE)\n"
        "  --schedule 1f1b|flush  PipeDream's 1F1B with weight stashing (each --batch is a\n"
        "                      minibatch and an update), or flush (each --batch is\n"
        "                      --microbatches minibatches and one update: sequential training)\n"
        "  --microbatches M    flush: minibatches per --batch (default 4)\n"
        "Under a job spec's pipeline section (ddprun-job(5)), DDPRUN_PIPELINE_SPLIT, _REPLICAS,\n"
        "_SCHEDULE, _MICROBATCHES and _MICROBATCH_SIZE (a minibatch's samples: --batch is it\n"
        "times the microbatches with flush) give the pipeline flags' defaults.\n",
        prog);
}

/* "A,B,..." of positive numbers, at most MAX_LAYERS: how many, or death naming the flag. */
static int int_list(const char *arg, int *out, const char *flag)
{
    int n = 0;
    for (const char *s = arg; *s;) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || v > 1000000 || (*e && *e != ',') || n == MAX_LAYERS)
            die("%s wants up to %d positive numbers separated by commas, not '%s'", flag,
                MAX_LAYERS, arg);
        out[n++] = (int)v;
        s = *e ? e + 1 : e;
    }
    if (n == 0)
        die("%s wants positive numbers separated by commas, not '%s'", flag, arg);
    return n;
}

void parse(int argc, char **argv, struct cfg *c)
{
    int nrep = 0;
    *c = (struct cfg){.epochs = 3,
                      .batch = 64,
                      .nhidden = 2,
                      .hidden = {256, 128},
                      .seed = 1,
                      .lr = 0.02f,
                      .momentum = 0.9f,
                      .data = "/usr/share/datasets/fashion-mnist",
                      .ckpt_dir = getenv("DDPRUN_CHECKPOINT_DIR"),
                      .tol = 1e-4,
                      .ddp = true,
                      .overlap = true,
                      .eval_every = 1,
                      .bucket_mb = -1,
                      .first_mb = -1,
                      .microbatches = 4};
    /* A job spec's pipeline section (ddprun-job(5)) gives the defaults; flags override. */
    int env_nrep = 0, env_replicas[MAX_LAYERS];
    bool pipe_flag = false;
    const char *ev;
    if ((ev = getenv("DDPRUN_PIPELINE_SPLIT")) && *ev) {
        c->pipeline_arg = ev;
        c->pipe_nstages = int_list(ev, c->pipe_split, "DDPRUN_PIPELINE_SPLIT");
        if ((ev = getenv("DDPRUN_PIPELINE_REPLICAS")) && *ev)
            env_nrep = int_list(ev, env_replicas, "DDPRUN_PIPELINE_REPLICAS");
    }
    if ((ev = getenv("DDPRUN_PIPELINE_SCHEDULE")) && *ev)
        c->schedule_flush = strcmp(ev, "flush") == 0;
    if ((ev = getenv("DDPRUN_PIPELINE_MICROBATCHES")) && atoi(ev) > 0)
        c->microbatches = atoi(ev);
    int env_mbsize = (ev = getenv("DDPRUN_PIPELINE_MICROBATCH_SIZE")) ? atoi(ev) : 0;
    bool batch_flag = false;
    enum {
        O_EPOCHS = 256,
        O_BATCH,
        O_HIDDEN,
        O_LR,
        O_MOM,
        O_SEED,
        O_DATA,
        O_CKPT,
        O_CKEVERY,
        O_MAXSTEPS,
        O_NODDP,
        O_SIM,
        O_VIEW,
        O_NOOVER,
        O_BMB,
        O_FMB,
        O_HOOK,
        O_BENCH,
        O_PAIRED,
        O_VIEWCOPY,
        O_DUMP,
        O_CMP,
        O_TOL,
        O_EVAL,
        O_PROFILE,
        O_PIPE,
        O_REPLICAS,
        O_SCHEDULE,
        O_MICRO,
        O_HELP
    };
    static const struct option lo[] = {{"epochs", 1, 0, O_EPOCHS},
                                       {"batch", 1, 0, O_BATCH},
                                       {"hidden", 1, 0, O_HIDDEN},
                                       {"lr", 1, 0, O_LR},
                                       {"momentum", 1, 0, O_MOM},
                                       {"seed", 1, 0, O_SEED},
                                       {"data", 1, 0, O_DATA},
                                       {"checkpoint-dir", 1, 0, O_CKPT},
                                       {"checkpoint-every", 1, 0, O_CKEVERY},
                                       {"max-steps", 1, 0, O_MAXSTEPS},
                                       {"no-ddp", 0, 0, O_NODDP},
                                       {"simulate-ranks", 1, 0, O_SIM},
                                       {"bucket-view", 0, 0, O_VIEW},
                                       {"no-overlap", 0, 0, O_NOOVER},
                                       {"bucket-mb", 1, 0, O_BMB},
                                       {"first-bucket-mb", 1, 0, O_FMB},
                                       {"hook", 1, 0, O_HOOK},
                                       {"bench", 0, 0, O_BENCH},
                                       {"bench-paired", 0, 0, O_PAIRED},
                                       {"bench-view-copy", 0, 0, O_VIEWCOPY},
                                       {"dump", 1, 0, O_DUMP},
                                       {"compare", 1, 0, O_CMP},
                                       {"tol", 1, 0, O_TOL},
                                       {"eval-every", 1, 0, O_EVAL},
                                       {"profile-graph", 1, 0, O_PROFILE},
                                       {"pipeline", 1, 0, O_PIPE},
                                       {"replicas", 1, 0, O_REPLICAS},
                                       {"schedule", 1, 0, O_SCHEDULE},
                                       {"microbatches", 1, 0, O_MICRO},
                                       {"help", 0, 0, O_HELP},
                                       {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case O_EPOCHS:
            c->epochs = atoi(optarg);
            break;
        case O_BATCH:
            c->batch = atoi(optarg);
            batch_flag = true;
            break;
        case O_HIDDEN: {
            c->nhidden = 0;
            for (char *s = optarg; *s && c->nhidden < MAX_LAYERS - 1;) {
                c->hidden[c->nhidden++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
                else if (*s)
                    die("--hidden wants widths separated by commas, not '%s'", optarg);
            }
            break;
        }
        case O_LR:
            c->lr = strtof(optarg, NULL);
            break;
        case O_MOM:
            c->momentum = strtof(optarg, NULL);
            break;
        case O_SEED:
            c->seed = atoi(optarg);
            break;
        case O_DATA:
            c->data = optarg;
            break;
        case O_CKPT:
            c->ckpt_dir = optarg;
            break;
        case O_CKEVERY:
            c->ckpt_every = atoi(optarg);
            break;
        case O_MAXSTEPS:
            c->max_steps = atol(optarg);
            break;
        case O_NODDP:
            c->ddp = false;
            break;
        case O_SIM:
            c->sim_ranks = atoi(optarg);
            if (c->sim_ranks < 1)
                die("--simulate-ranks wants a positive number of ranks, not '%s'", optarg);
            c->ddp = false;
            break;
        case O_VIEW:
            c->view = true;
            break;
        case O_NOOVER:
            c->overlap = false;
            break;
        case O_BMB:
            c->bucket_mb = atof(optarg);
            break;
        case O_FMB:
            c->first_mb = atof(optarg);
            break;
        case O_HOOK:
            if (strcmp(optarg, "fp16") == 0)
                c->hook = DDP_HOOK_FP16;
            else if (strcmp(optarg, "bf16") == 0)
                c->hook = DDP_HOOK_BF16;
            else
                die("--hook is fp16 or bf16, not '%s'", optarg);
            break;
        case O_BENCH:
            c->bench = true;
            break;
        case O_PAIRED:
            c->bench = c->paired = true;
            break;
        case O_VIEWCOPY:
            c->bench = c->view_copy = true;
            break;
        case O_DUMP:
            c->dump = optarg;
            break;
        case O_CMP:
            c->compare = optarg;
            break;
        case O_TOL:
            c->tol = atof(optarg);
            break;
        case O_EVAL:
            c->eval_every = atoi(optarg);
            break;
        case O_PROFILE:
            c->profile_graph = optarg;
            break;
        case O_PIPE:
            c->pipeline_arg = optarg;
            c->pipe_nstages = int_list(optarg, c->pipe_split, "--pipeline");
            pipe_flag = true;
            break;
        case O_REPLICAS:
            nrep = int_list(optarg, c->pipe_replicas, "--replicas");
            break;
        case O_SCHEDULE:
            if (strcmp(optarg, "1f1b") && strcmp(optarg, "flush"))
                die("--schedule is 1f1b or flush, not '%s'", optarg);
            c->schedule_flush = strcmp(optarg, "flush") == 0;
            break;
        case O_MICRO:
            c->microbatches = atoi(optarg);
            if (c->microbatches < 1)
                die("--microbatches wants a positive number, not '%s'", optarg);
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind != argc || c->epochs < 1 || c->batch < 1 || c->nhidden < 0)
        die("bad arguments (see --help)");
    if (env_mbsize > 0 && !batch_flag && c->pipe_nstages) /* flush: a batch of microbatches */
        c->batch = env_mbsize * (c->schedule_flush ? c->microbatches : 1);
    if (!nrep && !pipe_flag && env_nrep) {
        nrep = env_nrep;
        memcpy(c->pipe_replicas, env_replicas, sizeof(env_replicas));
    }
    if (nrep && nrep != c->pipe_nstages)
        die("--replicas has %d counts for the %d stages of --pipeline", nrep, c->pipe_nstages);
    for (int s = nrep; s < c->pipe_nstages; s++)
        c->pipe_replicas[s] = 1;
    for (int l = 0; l < c->nhidden; l++)
        if (c->hidden[l] < 1)
            die("--hidden widths must be positive");
}

void init_weights(uint64_t *s, float *W, size_t in, size_t out)
{
    float lim = sqrtf(6.0f / (float)in); /* He uniform, for ReLU */
    for (size_t i = 0; i < in * out; i++)
        W[i] = ((float)(mix(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * lim;
}

double median_ms(double *t, long n, long *used)
{
    long skip = n > 10 ? 5 : 0; /* warm-up */
    qsort(t + skip, (size_t)(n - skip), sizeof(double), cmp_double);
    *used = n - skip;
    return n > skip ? t[skip + (n - skip) / 2] * 1e3 : 0.0;
}

int dump_compare(const float *flat, size_t n, const struct cfg *c)
{
    int rc = 0;
    if (c->dump) {
        FILE *f = fopen(c->dump, "wb");
        if (!f || fwrite(flat, sizeof(float), n, f) != n || fclose(f) != 0)
            die("cannot write %s", c->dump);
    }
    if (c->compare) {
        FILE *f = fopen(c->compare, "rb");
        float *ref = malloc(n * sizeof(float));
        if (!f || fread(ref, sizeof(float), n, f) != n)
            die("cannot read %s (or it has another size)", c->compare);
        fclose(f);
        double md = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)flat[i] - (double)ref[i]);
            md = d > md ? d : md;
        }
        printf("compare: max |difference| from %s = %.3g (tolerance %.3g)\n", c->compare, md,
               c->tol);
        rc = md <= c->tol ? 0 : 1;
        free(ref);
    }
    return rc;
}

void model_shape(struct model *m, const struct cfg *c)
{
    m->L = c->nhidden + 1;
    m->dim[0] = IMG;
    for (int l = 0; l < c->nhidden; l++)
        m->dim[l + 1] = c->hidden[l];
    m->dim[m->L] = CLASSES;
}

size_t nparams(const struct model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->L; l++)
        n += (size_t)m->dim[l] * (size_t)m->dim[l + 1] + (size_t)m->dim[l + 1];
    return n;
}

struct ddp_reducer *make_reducer(struct ddp_pg *pg, struct model *m, const struct cfg *c)
{
    struct ddp_param ps[2 * MAX_LAYERS];
    char pname[2 * MAX_LAYERS][32];
    for (int l = 0; l < m->L; l++)
        for (int w = 0; w < 2; w++) {
            int i = 2 * l + w;
            snprintf(pname[i], sizeof(pname[i]), "fc%d.%s", l + 1, w ? "bias" : "weight");
            ps[i] = (struct ddp_param){.name = pname[i],
                                       .data = w ? m->b[l] : m->W[l],
                                       .grad = (void **)(w ? &m->gb[l] : &m->gW[l]),
                                       .count = w ? (size_t)m->dim[l + 1]
                                                  : (size_t)m->dim[l] * (size_t)m->dim[l + 1],
                                       .dtype = DDP_F32,
                                       .ndim = w ? 1 : 2,
                                       .shape = {m->dim[l + 1], w ? 0 : m->dim[l]}};
        }
    struct ddp_reducer_opts ro = {.gradient_as_bucket_view = c->view,
                                  .no_overlap = !c->overlap,
                                  .find_unused_parameters = c->find_unused,
                                  .hook = c->hook};
    if (c->bucket_mb >= 0)
        ro.bucket_cap_bytes = c->bucket_mb > 0 ? (size_t)(c->bucket_mb * (1 << 20)) : 1;
    if (c->first_mb >= 0)
        ro.first_bucket_bytes = c->first_mb > 0 ? (size_t)(c->first_mb * (1 << 20)) : 1;
    else if (c->bucket_mb == 0)
        ro.first_bucket_bytes = 1;
    struct ddp_reducer *red = NULL;
    if (ddp_reducer_new(pg, ps, (size_t)(2 * m->L), &ro, &red) != 0)
        die("cannot create the reducer: %s", ddp_reducer_new_error());
    return red;
}

void print_epoch(const struct cfg *c, int epoch, int64_t step, double loss_sum, double samples,
                 bool eval, double test_loss, double test_acc, double seconds)
{
    if (rank != 0)
        return;
    printf("epoch %d/%d step %lld train-loss %.4f", epoch + 1, c->epochs, (long long)step,
           samples > 0 ? loss_sum / samples : 0.0);
    if (eval)
        printf(" test-loss %.4f test-acc %.2f%%", test_loss, test_acc);
    printf(" %.0f samples/s\n", samples / seconds);
    fflush(stdout);
}

void print_bench(double *step_t, long n, struct ddp_reducer *red)
{
    if (rank != 0 || n <= 0)
        return;
    long used;
    double med = median_ms(step_t, n, &used);
    printf("bench: median step %.3f ms over %ld steps\n", med, used);
    if (!red)
        return;
    struct ddp_reducer_stats st;
    ddp_reducer_get_stats(red, &st);
    printf("bench: %zu buckets, %llu all-reduces (%llu started in backward), "
           "%.2f us host time per launch, %.3f ms finalize wait per step\n",
           ddp_reducer_num_buckets(red), (unsigned long long)st.buckets_launched,
           (unsigned long long)st.launched_in_backward,
           st.buckets_launched ? (double)st.launch_host_ns / 1e3 / (double)st.buckets_launched
                               : 0.0,
           st.iterations ? (double)st.finalize_wait_ns / 1e6 / (double)st.iterations : 0.0);
}

/* The medians of a step's phases: forward and backward (with the buckets' launches), the
 * reducer's finalize (the wait for communication, the copies out), the optimizer. */
void print_phases(double *const phase_t[3], long n)
{
    if (rank != 0 || n <= 0)
        return;
    long used;
    double f = median_ms(phase_t[0], n, &used), w = median_ms(phase_t[1], n, &used),
           o = median_ms(phase_t[2], n, &used);
    printf("bench: phases (medians): forward+backward %.3f ms, finalize %.3f ms, optimizer "
           "%.3f ms\n",
           f, w, o);
}

/*
 * --bench-view-copy: even steps ran the bucket-view reducer, odd steps the copy one. Each
 * mode's median step and phases after the same warm-up, and copy / view of each odd step
 * against the even step before it (their median and quartiles), so the machine's drift
 * cancels pair by pair.
 */
static double mid(double *t, long n) /* the median, in ms (sorts t) */
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2] * 1e3;
}

void print_view_copy(double *step_t, double *const phase_t[3], long n)
{
    long skip = n > 20 ? 10 : 0, np = (n - skip) / 2;
    if (rank != 0 || np < 1)
        return;
    double *v[4], *k[4], *ratio = malloc((size_t)np * sizeof(double));
    for (int j = 0; j < 4; j++) {
        v[j] = malloc((size_t)np * sizeof(double));
        k[j] = malloc((size_t)np * sizeof(double));
        if (!v[j] || !k[j] || !ratio)
            die("out of memory");
    }
    for (long i = 0; i < np; i++) {
        long e = skip + 2 * i, o = e + 1;
        for (int j = 0; j < 4; j++) {
            const double *src = j == 0 ? step_t : phase_t[j - 1];
            v[j][i] = src[e];
            k[j][i] = src[o];
        }
        ratio[i] = step_t[o] / step_t[e];
    }
    static const char *const what[4] = {"step", "forward+backward", "finalize", "optimizer"};
    printf("bench: view-copy over %ld pairs (medians, ms):", np);
    for (int j = 0; j < 4; j++) {
        double mv = mid(v[j], np), mk = mid(k[j], np);
        printf("%s %s view %.3f copy %.3f", j ? "," : "", what[j], mv, mk);
    }
    double rm = mid(ratio, np) / 1e3;
    printf(
        "\nbench: view-copy: copy / view step, pair by pair: median %.3f (quartiles %.3f-%.3f)\n",
        rm, ratio[np / 4], ratio[(3 * np) / 4]);
    for (int j = 0; j < 4; j++) {
        free(v[j]);
        free(k[j]);
    }
    free(ratio);
}

/* --bench-paired: one all-reduce of a flat buffer of every gradient's bytes, after a barrier,
 * alone: the yardstick of what the reducer adds to a step. Every rank calls it. *skew: the
 * barrier's wait, how far the other ranks' compute-only step ran behind this rank's. */
double bench_bare_allreduce(struct ddp_pg *pg, float *flat, size_t count, double *skew)
{
    double tb = now_s();
    if (ddp_pg_barrier(pg) != 0)
        die("barrier failed: %s", ddp_pg_last_error(pg));
    double t0 = now_s();
    *skew = t0 - tb;
    if (ddp_pg_allreduce(pg, flat, count, DDP_F32, DDP_AVG) != 0)
        die("all-reduce failed: %s", ddp_pg_last_error(pg));
    return now_s() - t0;
}

/* Medians of the paired measurements (the same warm-up skipped), and of the differences
 * step - compute-only taken pair by pair, so that the machine's drift cancels; also less the
 * wait for the last rank's gradients (paired_t[3]), which no all-reduce can avoid. */
void print_paired(double *step_t, double *const paired_t[4], long n, size_t bytes, bool one_node)
{
    if (rank != 0 || n <= 0)
        return;
    double *diff = malloc((size_t)n * sizeof(double)), *beyond = malloc((size_t)n * sizeof(double));
    if (!diff || !beyond)
        die("out of memory");
    for (long i = 0; i < n; i++) {
        diff[i] = step_t[i] - paired_t[0][i];
        beyond[i] = diff[i] - paired_t[3][i];
    }
    long used;
    double add = median_ms(diff, n, &used), add2 = median_ms(beyond, n, &used),
           st = median_ms(step_t, n, &used), co = median_ms(paired_t[0], n, &used),
           ba = median_ms(paired_t[1], n, &used), sk = median_ms(paired_t[2], n, &used),
           la = median_ms(paired_t[3], n, &used);
    printf("bench: paired over %ld steps: step %.3f ms, compute-only %.3f ms, bare all-reduce of "
           "%zu bytes %.3f ms; added by the reducer %.3f ms = %.2f x bare\n",
           used, st, co, bytes, ba, add, ba > 0 ? add / ba : 0.0);
    printf("bench: paired: rank 0 waited %.3f ms at the barrier after its compute-only step (the "
           "ranks' skew, part of any synchronised step)\n",
           sk);
    if (one_node) /* else the ranks' clocks differ: not measured */
        printf("bench: paired: the last rank's gradients were ready %.3f ms after rank 0's; added "
               "beyond that wait %.3f ms = %.2f x bare\n",
               la, add2, ba > 0 ? add2 / ba : 0.0);
    free(diff);
    free(beyond);
}

void model_free(struct model *m, void (*release)(void *))
{
    for (int l = 0; l < m->L; l++) {
        release(m->W[l]);
        release(m->b[l]);
        release(m->vW[l]);
        release(m->vb[l]);
        release(m->own_g[2 * l]);
        release(m->own_g[2 * l + 1]);
    }
}

int dump_model(const struct model *m, const struct cfg *c,
               void (*copy)(void *dst, const void *src, size_t bytes))
{
    if (rank != 0 || (!c->dump && !c->compare))
        return 0;
    size_t n = nparams(m), k = 0;
    float *flat = malloc(n * sizeof(float));
    for (int l = 0; l < m->L; l++) {
        size_t nw = (size_t)m->dim[l] * (size_t)m->dim[l + 1], nb = (size_t)m->dim[l + 1];
        copy(flat + k, m->W[l], nw * sizeof(float));
        copy(flat + k + nw, m->b[l], nb * sizeof(float));
        k += nw + nb;
    }
    int rc = dump_compare(flat, n, c);
    free(flat);
    return rc;
}

double softmax_xent(const float *lg, const uint8_t *y, int b, float scale, float *dZ, long *correct)
{
    double total = 0;
    for (int i = 0; i < b; i++) {
        const float *z = lg + (size_t)i * CLASSES;
        float mx = z[0];
        int arg = 0;
        for (int k = 1; k < CLASSES; k++)
            if (z[k] > mx) {
                mx = z[k];
                arg = k;
            }
        double sum = 0;
        for (int k = 0; k < CLASSES; k++)
            sum += exp((double)(z[k] - mx));
        total += log(sum) - (double)(z[y[i]] - mx);
        if (correct)
            *correct += arg == y[i];
        if (dZ)
            for (int k = 0; k < CLASSES; k++) {
                double p = exp((double)(z[k] - mx)) / sum;
                dZ[(size_t)i * CLASSES + k] = (float)((p - (k == y[i])) * scale);
            }
    }
    return total;
}
