/* trio_procown spawner: start a command directly inside a cgroup.
 *
 * procown_spawn() is called through ctypes. It starts the command with
 * clone3(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP): the
 * child is created inside the cgroup open on `cgroup_fd`, in a session of
 * its own, with the three stdio descriptors given, and execs the program.
 * The kernel places the child at fork time, under the cgroup mutex only;
 * moving an existing process (writing cgroup.procs, as the shim does) takes
 * the global threadgroup rwsem for writing, which waits for an RCU grace
 * period when the lock has been idle (~10 ms on kernels mounted without
 * favordynmods). CLONE_VM | CLONE_VFORK is what posix_spawn does: no page
 * tables are copied, and the caller's thread waits until the child has
 * exec'd or failed.
 *
 * The child runs on a stack of its own in the caller's memory: an array in
 * procown_spawn's frame, as musl's posix_spawn does (glibc maps one for
 * each spawn; the map and unmap cost ~13 us of a ~170 us spawn). The
 * caller is suspended until the child has exec'd or exited, so the frame
 * outlives every use. As in both, every signal is blocked around the clone
 * (a Python signal handler must never run in the child) and the child
 * resets to the default every signal that has a handler, and SIGPIPE and
 * SIGXFSZ (which Python ignores; subprocess's restore_signals), before restoring the mask
 * and exec'ing. It closes every descriptor above 2 (close_range), as
 * subprocess's close_fds does. An exec failure is reported through memory
 * the child shares with the caller.
 *
 * Returns the child's pid and its pidfd in *pidfd_out; on failure the
 * errno in *errno_out and -1 when the child's setup or exec failed (the
 * OSError to raise) or -2 when clone3 itself refused (an old kernel, a
 * seccomp filter, a cgroup that takes no process). x86_64 and
 * aarch64 only (the clone entry is assembly); elsewhere this file does not
 * build and the shim is used.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROCOWN_CLONE_VM 0x00000100ULL
#define PROCOWN_CLONE_VFORK 0x00004000ULL
#define PROCOWN_CLONE_PIDFD 0x00001000ULL
#define PROCOWN_CLONE_INTO_CGROUP 0x200000000ULL
#define PROCOWN_STACK (16 * 1024) /* the child uses well under 2 KiB: sigaction, dup3, execve */

struct procown_clone_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

/* long procown_clone3(struct procown_clone_args *, size_t, int (*fn)(void *), void *arg):
 * clone3; in the child (on the new stack) call fn(arg) and exit with its
 * result; in the caller return the pid or -errno. */
long procown_clone3(struct procown_clone_args *args, size_t size, int (*fn)(void *), void *arg);
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl procown_clone3\n"
        ".type procown_clone3,@function\n"
        "procown_clone3:\n"
        " mov %rdx, %r8\n"
        " mov %rcx, %r9\n"
        " mov $435, %eax\n"
        " syscall\n"
        " test %rax, %rax\n"
        " jz 1f\n"
        " ret\n"
        "1:\n"
        " xor %ebp, %ebp\n"
        " mov %r9, %rdi\n"
        " call *%r8\n"
        " mov %eax, %edi\n"
        " mov $60, %eax\n"
        " syscall\n"
        " hlt\n"
        ".size procown_clone3, .-procown_clone3\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl procown_clone3\n"
        ".type procown_clone3,%function\n"
        "procown_clone3:\n"
        " mov x8, #435\n"
        " svc #0\n"
        " cbz x0, 1f\n"
        " ret\n"
        "1:\n"
        " mov x0, x3\n"
        " blr x2\n"
        " mov x8, #93\n"
        " svc #0\n"
        " brk #0\n"
        ".size procown_clone3, .-procown_clone3\n");
#else
#error "procown spawner: x86_64 and aarch64 only"
#endif

struct job {
    const char *path;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int fds[3];
    sigset_t mask; /* the caller's mask, restored in the child before exec */
    volatile int err;
};

static long raw(long n, long a, long b, long c) { return syscall(n, a, b, c); }

static int child(void *arg) {
    struct job *job = arg;
    int src[3];
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        if (sigaction(sig, NULL, &old) != 0) continue; /* not a real signal (glibc's own) */
        int handled = old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN; /* sa_sigaction alike */
        if (handled || ((sig == SIGPIPE || sig == SIGXFSZ) && old.sa_handler == SIG_IGN)) {
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            sigaction(sig, &dfl, NULL);
        }
    }
    if (setsid() < 0) goto fail;
    for (int i = 0; i < 3; i++) src[i] = job->fds[i];
    /* A source below 3 that is not its own target would be overwritten by
     * an earlier dup2: move it above 2 first. */
    for (int i = 0; i < 3; i++) {
        if (src[i] >= 0 && src[i] < 3 && src[i] != i) {
            int old = src[i];
            int moved = (int)raw(SYS_fcntl, old, F_DUPFD_CLOEXEC, 3);
            if (moved < 0) goto fail;
            for (int k = 0; k < 3; k++)
                if (src[k] == old) src[k] = moved;
        }
    }
    for (int i = 0; i < 3; i++) {
        if (src[i] == i) {
            if (raw(SYS_fcntl, i, F_SETFD, 0) < 0) goto fail; /* inherited as is */
        } else if (raw(SYS_dup3, src[i], i, 0) < 0) {
            goto fail;
        }
    }
#ifdef SYS_close_range
    raw(SYS_close_range, 3, ~0L, 0); /* as close_fds: nothing above 2 is inherited */
#endif
    if (job->cwd != NULL && raw(SYS_chdir, (long)job->cwd, 0, 0) < 0) goto fail;
    sigprocmask(SIG_SETMASK, &job->mask, NULL);
    raw(SYS_execve, (long)job->path, (long)job->argv, (long)job->envp);
fail:
    job->err = errno ? errno : EINVAL;
    return 127;
}

long procown_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd, int in_fd,
                   int out_fd, int err_fd, int cgroup_fd, int *pidfd_out, int *errno_out) {
    struct job job;
    int pidfd = -1;
    sigset_t all;
    memset(&job, 0, sizeof job);
    job.path = path;
    job.argv = argv;
    job.envp = envp;
    job.cwd = cwd;
    job.fds[0] = in_fd;
    job.fds[1] = out_fd;
    job.fds[2] = err_fd;
    static_assert(PROCOWN_STACK % 16 == 0, "the stack's top must stay 16-byte aligned");
    _Alignas(16) char stack[PROCOWN_STACK];
    struct procown_clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = PROCOWN_CLONE_VM | PROCOWN_CLONE_VFORK | PROCOWN_CLONE_PIDFD;
    if (cgroup_fd >= 0) {
        args.flags |= PROCOWN_CLONE_INTO_CGROUP;
        args.cgroup = (uint64_t)cgroup_fd;
    }
    args.pidfd = (uint64_t)(uintptr_t)&pidfd;
    args.exit_signal = SIGCHLD;
    args.stack = (uint64_t)(uintptr_t)stack;
    args.stack_size = PROCOWN_STACK;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &job.mask);
    long pid = procown_clone3(&args, sizeof args, child, &job);
    sigprocmask(SIG_SETMASK, &job.mask, NULL);
    if (pid < 0) {
        *errno_out = (int)-pid;
        return -2; /* clone3 itself refused: nothing was started */
    }
    if (job.err != 0) {
        /* The child failed before its exec and has exited: reap it. */
        int status;
        while (waitpid((pid_t)pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (pidfd >= 0) close(pidfd);
        *errno_out = job.err;
        return -1;
    }
    *pidfd_out = pidfd;
    return pid;
}
