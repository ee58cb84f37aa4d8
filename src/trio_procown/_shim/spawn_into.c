/* trio_procown spawner: start a command directly inside a cgroup (and,
 * procown_scan at the end, read the process table off the event loop).
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
 * (a Python signal handler must never run in the child) and every signal
 * that has a handler is reset to the default, by the kernel at the clone
 * (CLONE_CLEAR_SIGHAND, Linux 5.5) or else by the child, as well as SIGPIPE
 * and SIGXFSZ (which Python ignores; subprocess's restore_signals), before
 * the child restores the mask and execs. It closes every descriptor above 2 (close_range), as
 * subprocess's close_fds does, but those in `keep` (sorted, each above 2),
 * which it makes inheritable: subprocess's pass_fds (a make jobserver's
 * pipe under `procown timeout`). An exec failure is reported through memory
 * the child shares with the caller.
 *
 * It also brackets the child's birth for its start time: born_out[0] is
 * CLOCK_BOOTTIME read just before the clone, born_out[1] the same clock
 * read by the child as its first act. The kernel stamps the start time
 * (/proc/PID/stat's starttime, in clock ticks) between the two; when both
 * fall in one tick, the caller knows it without reading /proc/PID/stat,
 * which, while the child is still inside its execve(), costs ~35-60 us.
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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROCOWN_CLONE_VM 0x00000100ULL
#define PROCOWN_CLONE_VFORK 0x00004000ULL
#define PROCOWN_CLONE_PIDFD 0x00001000ULL
#define PROCOWN_CLONE_INTO_CGROUP 0x200000000ULL
#define PROCOWN_CLONE_CLEAR_SIGHAND 0x100000000ULL

/* 1 while clone3 takes CLONE_CLEAR_SIGHAND (Linux 5.5): the kernel then
 * resets every handled signal to its default in the child, and the child
 * needs no sigaction per signal (~23 us of a ~190 us spawn, the caller
 * waiting). Set to 0 at the first refusal; tests set it to try the other
 * way. */
int procown_clear_sighand = 1;
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
    const int *keep; /* descriptors above 2 to pass on, ascending */
    int nkeep;
    sigset_t mask; /* the caller's mask, restored in the child before exec */
    volatile int err;
    volatile long long born; /* CLOCK_BOOTTIME in ns, read by the child first (0: not read) */
    int cleared;             /* the kernel reset the handlers (CLONE_CLEAR_SIGHAND) */
};

static long long boottime_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return 0;
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long raw(long n, long a, long b, long c) { return syscall(n, a, b, c); }

static int child(void *arg) {
    struct job *job = arg;
    int src[3];
    job->born = boottime_ns(); /* through the vDSO: no system call */
    for (int sig = job->cleared ? NSIG : 1; sig < NSIG; sig++) {
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
    if (job->cleared) { /* handlers are at their defaults: what Python ignores is still ignored */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGXFSZ, &dfl, NULL);
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
    long low = 3; /* as close_fds: nothing above 2 is inherited but what `keep` names */
    for (int i = 0; i < job->nkeep; i++) {
        long fd = job->keep[i];
#ifdef SYS_close_range
        if (fd > low) raw(SYS_close_range, low, fd - 1, 0);
#endif
        if (raw(SYS_fcntl, fd, F_SETFD, 0) < 0) goto fail; /* passed on: not close-on-exec */
        low = fd + 1;
    }
#ifdef SYS_close_range
    raw(SYS_close_range, low, ~0L, 0);
#endif
    if (job->cwd != NULL && raw(SYS_chdir, (long)job->cwd, 0, 0) < 0) goto fail;
    sigprocmask(SIG_SETMASK, &job->mask, NULL);
    raw(SYS_execve, (long)job->path, (long)job->argv, (long)job->envp);
fail:
    job->err = errno ? errno : EINVAL;
    return 127;
}

long procown_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd, int in_fd,
                   int out_fd, int err_fd, const int *keep, int nkeep, int cgroup_fd, int *pidfd_out,
                   int *errno_out, long long *born_out) {
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
    job.keep = keep;
    job.nkeep = nkeep;
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
    job.cleared = procown_clear_sighand;
    if (job.cleared) args.flags |= PROCOWN_CLONE_CLEAR_SIGHAND;
    born_out[0] = boottime_ns();
    long pid = procown_clone3(&args, sizeof args, child, &job);
    if (pid == -EINVAL && job.cleared) { /* a kernel older than 5.5: reset them in the child */
        procown_clear_sighand = 0;
        job.cleared = 0;
        args.flags &= ~PROCOWN_CLONE_CLEAR_SIGHAND;
        born_out[0] = boottime_ns();
        pid = procown_clone3(&args, sizeof args, child, &job);
    }
    born_out[1] = job.born;
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

/* procown_scan(): the process table, read without the caller's interpreter.
 *
 * _procfs's shared scan (one per round of teardowns asking together) reads
 * /proc/PID/stat of every process and, for processes started at or after
 * `since` (clock ticks since boot; 0 counts as unknown and is always read),
 * the entry of the environment variable `key` (which ends with "="): the
 * census cookie. Called through ctypes from a worker thread, the scan holds
 * no interpreter lock, so the event loop goes on while 10,000 processes are
 * read (~0.3 s of the loop when done in Python on it).
 *
 * One record per process listed, in /proc's order:
 *   "PID PPID PGRP STATE START F\0" and, when F is 'e', "KEY=VALUE\0"
 * F: 'n' environment not read (a zombie, `self`, started before `since`,
 * or no key asked), 'u' not readable for lack of permission, 'a' read and
 * the key absent (or no environment at all), 'e' the entry follows.
 * An empty environment is read again (sched_yield between, at most
 * `retries` times) while the process is inside execve() (env_start still
 * 0, or env_end past env_start: _procfs.exec_in_progress); one refused for
 * lack of permission is not (it is 'u'). A process gone between the
 * listing and its stat is left out, as in _procfs.read_stat.
 *
 * Returns the bytes written, -1 (errno in *errno_out) when /proc cannot be
 * listed or memory ran out, or -2 when `cap` is too small: *need_out then
 * says how many bytes this scan took (the caller grows the buffer and asks
 * again).
 */
#define PROCOWN_PF_KTHREAD 0x00200000UL

struct stat_fields {
    char state;
    long ppid, pgrp;
    unsigned long flags;
    unsigned long long start, env_start, env_end;
    int has_env_range;
};

/* Parse /proc/PID/stat into *out; 0 on success, -1 when it cannot be read. */
static int read_stat_fields(const char *pid, struct stat_fields *out) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    /* The command name is in parentheses and may itself hold ") ". */
    char *p = NULL;
    for (ssize_t i = n - 2; i >= 0; i--) {
        if (buf[i] == ')' && buf[i + 1] == ' ') {
            p = buf + i + 2;
            break;
        }
    }
    if (p == NULL) return -1;
    /* p: field 3 (state) onwards, space separated; index 0 is the state. */
    unsigned long long v[64];
    int count = 0;
    char state = *p;
    char *q = p;
    while (*q && *q != ' ') q++;
    while (*q == ' ' && count < 64) {
        q++;
        char *end;
        v[count++] = strtoull(q, &end, 10);
        if (end == q) break;
        q = end;
    }
    /* v[k] is field index k + 1 (index 0 is the state). */
    if (count < 19) return -1;
    out->state = state;
    out->ppid = (long)v[0];
    out->pgrp = (long)v[1];
    out->flags = (unsigned long)v[5];
    out->start = v[18];
    out->has_env_range = count >= 48;
    out->env_start = out->has_env_range ? v[46] : 0;
    out->env_end = out->has_env_range ? v[47] : 0;
    return 0;
}

static int exec_in_progress(const char *pid) {
    struct stat_fields f;
    if (read_stat_fields(pid, &f) != 0) return 0;
    if (f.state == 'Z' || f.state == 'X' || (f.flags & PROCOWN_PF_KTHREAD)) return 0;
    if (!f.has_env_range) return 1;
    return f.env_start == 0 || f.env_end > f.env_start;
}

/* The environment of `pid` into *buf (grown as needed): its length, -1
 * when it cannot be read (*denied set when for lack of permission), or -2
 * when no memory could hold it. */
static long read_environ_block(const char *pid, char **buf, size_t *size, int *denied) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (denied) *denied = errno == EACCES || errno == EPERM;
        return -1;
    }
    size_t len = 0;
    for (;;) {
        if (len == *size) {
            char *bigger = realloc(*buf, *size * 2);
            if (bigger == NULL) {
                close(fd);
                return -2;
            }
            *buf = bigger;
            *size *= 2;
        }
        ssize_t n = read(fd, *buf + len, *size - len);
        if (n < 0) {
            if (errno == EINTR) continue;
            close(fd);
            return -1;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    close(fd);
    return (long)len;
}

long procown_scan(char *out, long cap, const char *key, long key_len, unsigned long long since, int self_pid,
                  int retries, int *errno_out, long *need_out) {
    DIR *dir = opendir("/proc");
    if (dir == NULL) {
        *errno_out = errno;
        return -1;
    }
    size_t env_size = 16384;
    char *env = malloc(env_size);
    if (env == NULL) {
        closedir(dir);
        *errno_out = ENOMEM;
        return -1;
    }
    long used = 0;
    long result = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        const char *name = entry->d_name;
        if (name[0] < '0' || name[0] > '9') continue;
        int digits = 1;
        for (const char *c = name; *c; c++)
            if (*c < '0' || *c > '9') digits = 0;
        if (!digits) continue;
        struct stat_fields f;
        if (read_stat_fields(name, &f) != 0) continue;
        long pid = strtol(name, NULL, 10);
        char flag = 'n';
        const char *found = NULL;
        size_t found_len = 0;
        int zombie = f.state == 'Z' || f.state == 'X';
        if (key != NULL && !zombie && pid != self_pid && (f.start == 0 || f.start >= since)) {
            int denied = 0;
            long len = read_environ_block(name, &env, &env_size, &denied);
            for (int i = 0; i < retries && len <= 0 && !denied && exec_in_progress(name); i++) {
                sched_yield();
                len = read_environ_block(name, &env, &env_size, NULL);
            }
            if (len == -2) {
                result = -1; /* an entry could be missed: the caller scans its own way */
                *errno_out = ENOMEM;
                break;
            }
            if (len < 0 && denied) {
                flag = 'u';
            } else {
                flag = 'a';
                for (long at = 0; len > 0 && at < len;) {
                    const char *nul = memchr(env + at, '\0', (size_t)(len - at));
                    size_t entry_len = nul ? (size_t)(nul - (env + at)) : (size_t)(len - at);
                    if (entry_len >= (size_t)key_len && memcmp(env + at, key, (size_t)key_len) == 0) {
                        flag = 'e';
                        found = env + at;
                        found_len = entry_len;
                        break;
                    }
                    at += (long)entry_len + 1;
                }
            }
        }
        char head[128];
        int n = snprintf(head, sizeof head, "%ld %ld %ld %c %llu %c", pid, f.ppid, f.pgrp, f.state, f.start, flag);
        long need = n + 1 + (flag == 'e' ? (long)found_len + 1 : 0);
        if (result == -2 || used + need > cap) {
            result = -2; /* go on counting what it takes, for *need_out */
            used += need;
            continue;
        }
        memcpy(out + used, head, (size_t)n + 1);
        used += n + 1;
        if (flag == 'e') {
            memcpy(out + used, found, found_len);
            out[used + (long)found_len] = '\0';
            used += (long)found_len + 1;
        }
    }
    closedir(dir);
    free(env);
    *need_out = used;
    return result < 0 ? result : used;
}

/* procown_members(): the processes of a cgroup tree, in one call.
 *
 * The cgroup domain's graceful stage signals the leader's process group
 * (one killpg) and then every member outside it, found by listing
 * cgroup.procs of the cgroup and of every cgroup below it and reading each
 * member's process group from /proc/PID/stat. In Python, on the loop, the
 * listing cost 150-290 us a command in a burst; this does the same reads
 * in one call (_cgroup.native_members).
 *
 * One line per record:
 *   "P PID PGRP START" a member, with its process group and start time;
 *   "G PID"            a listed pid whose stat could not be read (gone);
 *   "E ERRNO PATH"     a cgroup.procs that could not be read (not ENOENT:
 *                      a cgroup removed meanwhile has nobody to list).
 * Cgroups nested deeper than PROCOWN_TREE_DEPTH are an ELOOP record.
 * Returns the bytes written, or -2 when `cap` is too small (*need_out then
 * says what it took).
 */
#define PROCOWN_TREE_DEPTH 32

struct out_buf {
    char *out;
    long cap, used;
};

static void emit(struct out_buf *o, const char *text, int n) {
    if (o->used + n <= o->cap) memcpy(o->out + o->used, text, (size_t)n);
    o->used += n; /* past cap: only counted, for *need_out */
}

static void list_tree(const char *dir, int depth, struct out_buf *o, char **buf, size_t *size) {
    char path[4096], line[4200];
    int n;
    if (depth > PROCOWN_TREE_DEPTH) {
        n = snprintf(line, sizeof line, "E %d %s\n", ELOOP, dir);
        emit(o, line, n);
        return;
    }
    if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) {
        n = snprintf(line, sizeof line, "E %d %.4000s\n", ENAMETOOLONG, dir);
        emit(o, line, n);
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) {
            n = snprintf(line, sizeof line, "E %d %s\n", errno, dir);
            emit(o, line, n);
        }
        return;
    }
    size_t len = 0;
    int failed = 0;
    for (;;) {
        if (len + 1 >= *size) {
            char *bigger = realloc(*buf, *size * 2);
            if (bigger == NULL) {
                failed = ENOMEM;
                break;
            }
            *buf = bigger;
            *size *= 2;
        }
        ssize_t got = read(fd, *buf + len, *size - len - 1);
        if (got < 0) {
            if (errno == EINTR) continue;
            failed = errno;
            break;
        }
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    if (failed) {
        n = snprintf(line, sizeof line, "E %d %s\n", failed, dir);
        emit(o, line, n);
        return;
    }
    (*buf)[len] = '\0';
    char *p = *buf;
    while (*p) {
        while (*p == '\n' || *p == ' ') p++;
        if (!*p) break;
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        char name[32];
        snprintf(name, sizeof name, "%ld", pid);
        struct stat_fields f;
        if (read_stat_fields(name, &f) == 0)
            n = snprintf(line, sizeof line, "P %ld %ld %llu\n", pid, f.pgrp, f.start);
        else
            n = snprintf(line, sizeof line, "G %ld\n", pid);
        emit(o, line, n);
    }
    /* cgroupfs counts a directory's links as 2 + its child directories. */
    struct stat st;
    if (stat(dir, &st) == 0 && st.st_nlink == 2) return;
    DIR *d = opendir(dir);
    if (d == NULL) return; /* as os.walk: a directory that cannot be read is left out */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char child[4096];
        if (snprintf(child, sizeof child, "%s/%s", dir, e->d_name) >= (int)sizeof child) continue;
        list_tree(child, depth + 1, o, buf, size);
    }
    closedir(d);
}

long procown_members(const char *cgroup, char *out, long cap, long *need_out) {
    struct out_buf o = {out, cap, 0};
    size_t size = 4096;
    char *buf = malloc(size);
    if (buf == NULL) {
        *need_out = 0;
        return -1;
    }
    list_tree(cgroup, 0, &o, &buf, &size);
    free(buf);
    *need_out = o.used;
    return o.used > cap ? -2 : o.used;
}
