/*
 * The job file's key table (cli/spec/keys.def) is the loader's and plan's one source: every
 * value of the table, set to a value of its kind that is not its default, is read by the
 * loader and printed by `ddprun plan` as "name: value" in its section. A key added to the table
 * alone is checked here with the others (and 01-cli-docs requires it in ddprun-job(5)).
 */
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The job every key is set on: three local nodes, room in elastic for any count, and for the
 * TLS keys an etcd rendezvous whose files go together. */
static const char base_yaml[] = "command: [true]\n"
                                "nodes: [localhost, 127.0.0.1, \"::1\"]\n"
                                "elastic: {heartbeat_timeout: 30s, min_nodes: 1}\n";
static const char etcd_yaml[] = "command: [true]\n"
                                "nodes: [localhost]\n"
                                "rendezvous: {backend: etcd, endpoints: [\"https://e:1\"],\n"
                                "             tls: {ca: /c, cert: /c, key: /k}}\n";

/* A value of key k's kind that is not its default, as written and as plan shows it. */
static void sample(const struct ddp__key *k, char *out, size_t n)
{
    switch (k->kind) {
    case DDP_KK_STR: /* (an address where the key is one) */
        snprintf(out, n, "%s",
                 strcmp(k->path, "metrics.listen") == 0 ? "127.0.0.1:9400" : "sample-v");
        break;
    case DDP_KK_PATH_:
        snprintf(out, n, "/sample/path");
        break;
    case DDP_KK_INT:
        snprintf(out, n, "%ld", k->lo + 1 <= k->hi ? k->lo + 1 : k->lo);
        break;
    case DDP_KK_BOOL:
        snprintf(out, n, "%s", k->dflt && strcmp(k->dflt, "true") == 0 ? "false" : "true");
        break;
    default:
        snprintf(out, n, "7s");
        break;
    }
}

TEST(every_value_of_the_table_is_read_and_shown_by_plan)
{
    int checked = 0;
    for (int id = 0; id < DDP_K__COUNT; id++) {
        const struct ddp__key *k = &ddp__keys[id];
        if (k->kind < DDP_KK_STR)
            continue;
        char val[64], set[160], want[200];
        sample(k, val, sizeof(val));
        snprintf(set, sizeof(set), "%s=%s", k->path, val);
        /* (checkpoint.replicas needs a checkpoint.dir beside it) */
        const char *sets[] = {set, "checkpoint.dir=/sample/ck"};
        bool tls = strncmp(k->path, "rendezvous.tls.", 15) == 0;
        bool ck = strncmp(k->path, "checkpoint.", 11) == 0 && strcmp(k->path, "checkpoint.dir");
        struct ddp_job *j = NULL;
        int rc = ddp__job_load_string("keys.yaml", tls ? etcd_yaml : base_yaml, sets, NULL,
                                      ck ? 2 : 1, &j);
        if (rc != 0)
            fprintf(stderr, "key %s = %s: not loaded\n", k->path, val);
        ASSERT_EQ(rc, 0);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        ddp__job_print_plan(j, "ID", f);
        fclose(f);
        /* "name: value" at the start of a line (a key at the top), else inside its section's
         * braces after "{" or ", " */
        snprintf(want, sizeof(want), "%s%s: %s", strchr(k->path, '.') ? "" : "\n",
                 ddp__key_name(id), val);
        bool found = strstr(text, want) != NULL;
        if (!found)
            fprintf(stderr, "key %s = %s: plan shows no '%s'\n%s", k->path, val, want, text);
        ASSERT_TRUE(found);
        free(text);
        ddp__job_free(j);
        checked++;
    }
    ASSERT_GE(checked, 25);
}

TEST(every_key_is_in_a_section_of_the_table_before_it)
{
    for (int id = 0; id < DDP_K__COUNT; id++) {
        const char *dot = strrchr(ddp__keys[id].path, '.');
        if (!dot)
            continue;
        int p = ddp__key_parent(id);
        ASSERT_TRUE(p >= 0 && p < id);
        ASSERT_EQ(strlen(ddp__keys[p].path), (size_t)(dot - ddp__keys[id].path));
    }
}
