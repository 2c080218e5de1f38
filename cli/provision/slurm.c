/*
 * Slurm at run time (cli/provision/slurm.h): what ranks see of it, and whether the allocation still
 * runs.
 *
 * What ranks see: Under srun, the agent is a task of a job step of its own,
 * and Slurm describes that step in the agent's environment: SLURM_PROCID=0, SLURM_LOCALID=0,
 * SLURM_NTASKS=1, SLURM_NNODES=1, SLURM_STEP_*, ... Passed on, they would tell every rank that
 * it is task 0 of a one-task job (libraries such as PyTorch Lightning and submitit read them to
 * find their rank). Ranks keep what describes the allocation (SLURM_JOB_*, SLURM_JOBID, the
 * cluster, the submission) and lose the rest; their place is in RANK, LOCAL_RANK, WORLD_SIZE.
 */
#include "cli/provision/slurm.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "common/htab.h"
#include "common/list.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "common/banned.h"

extern char **environ;

static bool kept(const char *kv)
{
    static const char *const keep[] = {
        "SLURM_JOB_",        "SLURM_JOBID=",       "SLURM_CLUSTER_NAME=",    "SLURM_CONF=",
        "SLURM_SUBMIT_DIR=", "SLURM_SUBMIT_HOST=", "SLURM_WORKING_CLUSTER=", "SLURM_TOPOLOGY_ADDR"};
    if (strncmp(kv, "SLURM_", 6) != 0)
        return true;
    for (size_t k = 0; k < sizeof(keep) / sizeof(keep[0]); k++)
        if (!strncmp(kv, keep[k], strlen(keep[k])))
            return true;
    return false;
}

void ddp__slurm_scrub_env(void)
{
    for (size_t i = 0; environ && environ[i];) {
        const char *kv = environ[i], *eq = strchr(kv, '=');
        if (kept(kv) || !eq) {
            i++;
            continue;
        }
        char name[256];
        size_t l = (size_t)(eq - kv);
        if (l >= sizeof(name)) { /* no such Slurm variable: leave it */
            i++;
            continue;
        }
        memcpy(name, kv, l);
        name[l] = '\0';
        unsetenv(name); /* environ[i] is now the next variable */
    }
}

/* `scontrol show job -o ID` within 3 s: 1 with its JobState in state, 0 when Slurm no longer
 * knows the job ("ENDED"), -1 when it could not be asked. */
static int ask_state(const char *id, char *state, size_t n)
{
    char out[8192];
    int st = 0;
    char *argv[] = {"scontrol", "show", "job", "-o", (char *)id, NULL};
    /* JobState comes early: a line longer than out (a long command) still tells it. */
    int r = ddp__run_capture(argv, out, sizeof(out), 3000, &st);
    const char *js = strstr(out, "JobState=");
    if (js) {
        js += 9;
        snprintf(state, n, "%.*s", (int)strcspn(js, " \n"), js);
        return 1;
    }
    if (r == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1) { /* "Invalid job id specified" */
        snprintf(state, n, "ENDED");
        return 0;
    }
    return -1;
}

int ddp__slurm_alloc_state(char *state, size_t n)
{
    const char *id = getenv("SLURM_JOB_ID");
    if (!id || !*id)
        return -1;
    /* A job ending is COMPLETING until its processes are gone: wait (up to 3 s) to learn how
     * it ended. */
    for (int k = 0; k < 15; k++) {
        int r = ask_state(id, state, n);
        if (r <= 0)
            return r < 0 ? -1 : 0;
        if (!strcmp(state, "RUNNING") || !strcmp(state, "CONFIGURING") ||
            !strcmp(state, "SUSPENDED") || !strcmp(state, "RESIZING"))
            return 1;
        if (strcmp(state, "COMPLETING") != 0)
            return 0;
        /* A stop signal waiting (sbatch: Slurm's SIGTERM) says enough, and KillWait runs. */
        sigset_t pend;
        if (sigpending(&pend) == 0 && (sigismember(&pend, SIGTERM) || sigismember(&pend, SIGINT)))
            return 0;
        struct timespec ts = {.tv_nsec = 200 * 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

struct named {
    struct ddp_hnode h;
    size_t i;
};

/* The value of KEY= in a `scontrol -o` line (up to the next space), or NULL. */
static const char *field(const char *line, size_t len, const char *key, size_t *vlen)
{
    size_t kl = strlen(key);
    for (const char *p = line; p + kl <= line + len; p++) {
        if ((p == line || p[-1] == ' ') && memcmp(p, key, kl) == 0) {
            p += kl;
            const char *end = memchr(p, ' ', (size_t)(line + len - p));
            *vlen = (size_t)((end ? end : line + len) - p);
            return p;
        }
    }
    return NULL;
}

int ddp__slurm_node_addrs(const struct ddp_job *j, char **addr)
{
    size_t n = j->nnodes;
    for (size_t i = 0; i < n; i++)
        addr[i] = NULL;
    /* the allocation's nodes, in Slurm's compressed form: the job's are among them */
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !*list || n == 0)
        return -1;
    /* A line of about 600 bytes per node; 10,000 nodes are a few MiB. */
    size_t cap = n * 2048 + 65536;
    char *out = malloc(cap);
    struct named *nm = calloc(n, sizeof(*nm));
    struct ddp_htab t;
    int st = 0, r = -1;
    if (!out || !nm || ddp_htab_init(&t) < 0) {
        free(out);
        free(nm);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        nm[i].i = i;
        nm[i].h.key = (const uint8_t *)j->nodes[i].host;
        nm[i].h.klen = (uint32_t)strlen(j->nodes[i].host);
        if (!ddp_htab_find(&t, j->nodes[i].host, nm[i].h.klen))
            ddp_htab_insert(&t, &nm[i].h);
    }
    char *argv[] = {"scontrol", "show", "node", "-o", (char *)list, NULL};
    if (ddp__run_capture(argv, out, cap, 5000, &st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        goto out;
    r = 0;
    for (char *line = out; *line;) {
        size_t len = strcspn(line, "\n"), nl, al;
        const char *name = field(line, len, "NodeName=", &nl);
        const char *a = field(line, len, "NodeAddr=", &al);
        struct ddp_hnode *h = name ? ddp_htab_find(&t, name, nl) : NULL;
        /* the name is its address: resolved as a host name, as before */
        if (h && a && al && al < 256 && (al != nl || memcmp(a, name, al) != 0)) {
            size_t i = DDP_CONTAINER_OF(h, struct named, h)->i;
            free(addr[i]);
            addr[i] = strndup(a, al);
        }
        line += len + (line[len] == '\n');
    }
out:
    ddp_htab_release(&t);
    free(nm);
    free(out);
    return r;
}
