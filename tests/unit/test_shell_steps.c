/*
 * Several shell commands in one session (cli/sys/shell_steps.c), run here by a real /bin/sh -s
 * (dash on Debian) reading the script on its standard input, as the doctor's SSH session does:
 * each step's output and status found again, a gate ending the script, outputs without a final
 * newline or holding text like the mark's, a step that reads its input.
 */
#include "cli/sys/shell_steps.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The script's standard output through /bin/sh -s reading it on its standard input, as the
 * doctor's SSH session gives it. */
static void run_in(const char *shell, const char *script, char *out, size_t n)
{
    char path[] = "/tmp/ddp-steps-XXXXXX", cmd[128];
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(write(fd, script, strlen(script)), (ssize_t)strlen(script));
    close(fd);
    snprintf(cmd, sizeof(cmd), "cat %s | %s -s 2>/dev/null", path, shell); /* a pipe, as SSH's */
    FILE *p = popen(cmd, "r");
    ASSERT_TRUE(p != NULL);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    pclose(p);
    unlink(path);
}

static void run_sh(const char *script, char *out, size_t n)
{
    run_in("/bin/sh", script, out, n);
}

/* In shell (/bin/sh; bash, /bin/sh elsewhere, reads its script byte by byte from a pipe and
 * leaves the rest of it to a step that reads its input). */
static void steps_in(const char *shell)
{
    struct ddp__steps s;
    ddp__steps_init(&s);
    ddp__steps_raw(&s, "v=$(echo 'ddprun 1.2'); vs=$?");
    ddp__steps_add(&s, "printf '%%s\\n' \"$v\"; exit $vs");
    ddp__steps_add(&s, "cd /nonexistent-dir-for-this-test"); /* a failed cd ends its subshell */
    ddp__steps_add(&s, "pwd; printf 'no newline'");          /* the cd did not leak here */
    ddp__steps_add(&s, "printf '@ddprun-step-0000 3\\nx\\n'; exit 7"); /* another mark's text */
    ddp__steps_add(&s, "cat"); /* reads /dev/null, not the rest of the script */
    ddp__steps_add(&s, "true");
    char out[4096], *text[8];
    int status[8];
    const char *sh = ddp__steps_script(&s);
    ASSERT_TRUE(sh != NULL);
    run_in(shell, sh, out, sizeof(out));
    char cwd[1024];
    ASSERT_TRUE(getcwd(cwd, sizeof(cwd)) != NULL);
    ASSERT_EQ(ddp__steps_split(&s, out, text, status, 8), 6);
    ASSERT_STREQ(text[0], "ddprun 1.2\n");
    ASSERT_EQ(status[0], 0);
    ASSERT_STREQ(text[1], "");
    ASSERT_TRUE(status[1] != 0);
    char want[1100];
    snprintf(want, sizeof(want), "%s\nno newline", cwd);
    ASSERT_STREQ(text[2], want);
    ASSERT_EQ(status[2], 0);
    ASSERT_STREQ(text[3], "@ddprun-step-0000 3\nx\n");
    ASSERT_EQ(status[3], 7);
    ASSERT_STREQ(text[4], "");
    ASSERT_EQ(status[4], 0);
    ASSERT_STREQ(text[5], "");
    ASSERT_EQ(status[5], 0);
    ddp__steps_release(&s);
}

TEST(each_step_output_and_status_come_back)
{
    steps_in("/bin/sh");
    if (access("/bin/bash", X_OK) == 0)
        steps_in("/bin/bash");
}

TEST(a_gate_ends_the_script_after_a_failed_step)
{
    struct ddp__steps s;
    ddp__steps_init(&s);
    ddp__steps_add(&s, "echo one");
    ddp__steps_gate(&s);
    ddp__steps_add(&s, "echo two; exit 3");
    ddp__steps_gate(&s);
    ddp__steps_add(&s, "echo three"); /* never runs */
    char out[4096], *text[4];
    int status[4];
    run_sh(ddp__steps_script(&s), out, sizeof(out));
    ASSERT_EQ(ddp__steps_split(&s, out, text, status, 4), 2);
    ASSERT_STREQ(text[1], "two\n");
    ASSERT_EQ(status[1], 3);
    ASSERT_TRUE(strstr(out, "three") == NULL);
    /* at most max steps are taken; a session cut short has fewer marks */
    run_sh(ddp__steps_script(&s), out, sizeof(out));
    ASSERT_EQ(ddp__steps_split(&s, out, text, status, 1), 1);
    char cut[] = "one\n";
    ASSERT_EQ(ddp__steps_split(&s, cut, text, status, 4), 0);
    ddp__steps_release(&s);
}

TEST(every_script_has_a_mark_of_its_own)
{
    struct ddp__steps a, b;
    ddp__steps_init(&a);
    ddp__steps_init(&b);
    ASSERT_TRUE(strncmp(a.mark, "@ddprun-step-", 13) == 0);
    ASSERT_EQ(strlen(a.mark), 13 + 16);
    ASSERT_TRUE(strcmp(a.mark, b.mark) != 0);
    /* b's marks are not a's */
    ddp__steps_add(&b, "echo x");
    char out[1024], *text[2];
    int status[2];
    run_sh(ddp__steps_script(&b), out, sizeof(out));
    ASSERT_EQ(ddp__steps_split(&a, out, text, status, 2), 0);
    ASSERT_EQ(ddp__steps_split(&b, out, text, status, 2), 1);
    ddp__steps_release(&a);
    ddp__steps_release(&b);
}
