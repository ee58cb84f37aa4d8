/* trio_procown cgroup shim: enter a cgroup, then exec the command.
 *
 * usage: cgroup_shim CGROUP_PROCS_FILE PROGRAM ARGV0 [ARG...]
 *
 * PROGRAM is the file executed; the command's argv starts at ARGV0 (the
 * name it was asked for by, e.g. "ls", as execvp would give it).
 *
 * Writing "0" to cgroup.procs moves the writing process; doing it before
 * exec means the command is inside its cgroup before it can fork. Built
 * once per machine by trio_procown (static, so it starts in ~0.1 ms); the
 * /bin/sh shim is the fallback where no C compiler is available.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static void say(const char *msg) {
    ssize_t ignored = write(2, msg, strlen(msg));
    (void)ignored;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        say("usage: cgroup_shim CGROUP_PROCS_FILE PROGRAM ARGV0 [ARG...]\n");
        return 125;
    }
    int fd = open(argv[1], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) {
        say("trio_procown: cannot enter cgroup\n");
        return 125;
    }
    close(fd);
    execv(argv[2], argv + 3);
    say("trio_procown: cannot execute the command\n");
    return errno == ENOENT ? 127 : 126;
}
