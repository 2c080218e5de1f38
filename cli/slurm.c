/*
 * Slurm at run time (cli/cli.h): what ranks see of it, and whether the allocation still runs.
 *
 * What ranks see: Under srun, the agent is a task of a job step of its own,
 * and Slurm describes that step in the agent's environment: SLURM_PROCID=0, SLURM_LOCALID=0,
 * SLURM_NTASKS=1, SLURM_NNODES=1, SLURM_STEP_*, ... Passed on, they would tell every rank that
 * it is task 0 of a one-task job (libraries such as PyTorch Lightning and submitit read them to
 * find their rank). Ranks keep what describes the allocation (SLURM_JOB_*, SLURM_JOBID, the
 * cluster, the submission) and lose the rest; their place is in RANK, LOCAL_RANK, WORLD_SIZE.
 */
#include "cli/cli.h"

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
