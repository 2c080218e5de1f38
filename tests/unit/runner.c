/* The unit-test main: runs each registered test in a child process with an alarm. */
#include "tests/unit/test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

#define MAX_TESTS 512

static struct {
    const char *name;
    ddp_test_fn fn;
} tests[MAX_TESTS];
static int ntests;

void ddp_test_register(const char *name, ddp_test_fn fn)
{
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    unsigned timeout = getenv("DDP_TEST_TIMEOUT") ? (unsigned)atoi(getenv("DDP_TEST_TIMEOUT")) : 60;
    signal(SIGPIPE, SIG_IGN);
    /* A test asked for by a name that no test has is a failure, not an empty pass. */
    for (int a = 1; a < argc; a++) {
        int found = 0;
        for (int i = 0; i < ntests; i++)
            found |= strcmp(argv[a], tests[i].name) == 0;
        if (!found) {
            printf("FAIL %s (no such test)\n", argv[a]);
            failed++;
        }
    }
    for (int i = 0; i < ntests; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++)
                want |= strcmp(argv[a], tests[i].name) == 0;
            if (!want)
                continue;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(timeout);
            tests[i].fn();
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("ok   %s\n", tests[i].name);
            passed++;
        } else if (WIFSIGNALED(st)) {
            printf("FAIL %s (signal %d%s)\n", tests[i].name, WTERMSIG(st),
                   WTERMSIG(st) == SIGALRM ? ": timed out" : "");
            failed++;
        } else {
            printf("FAIL %s (exit %d)\n", tests[i].name, WEXITSTATUS(st));
            failed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
