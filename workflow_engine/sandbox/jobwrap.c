/* jobwrap: the wrapper of one local job.
 *
 *   jobwrap JOB_DIR DEADLINE GRACE ISOLATION UID TMP LIMIT... -- COMMAND...
 *   jobwrap --namespaces ISOLATION
 *
 * sandbox/_runner.py starts it (through sandbox/_wrapper.py: in a session of its own, stdout
 * and stderr on /dev/null, fd 3 the read end of the engine's pipe) and its docstring tells the
 * whole protocol; this is the one implementation of it (where it is not built, the local
 * sandbox and a worker node refuse to start). It runs in one exec, without forking a watchdog:
 *
 *   - reads the job from fd 6 (a memfd the engine wrote): the request's JSON, a NUL, then
 *     the command's environment as NAME=VALUE entries each ended by a NUL. Its own
 *     environment is the engine's fixed one: nothing a caller wrote reaches a process that
 *     runs as root (the loader reads LD_PRELOAD and the like from the environment);
 *   - claims the job by creating supervisor.pid exclusively, or runs nothing (exit 97);
 *   - runs nothing if the job was cancelled first (exit 98); writes request.json; makes
 *     work/ (owned by UID when there is one); says why in supervisor.log if it cannot (its
 *     stdout and stderr are /dev/null: that file is made only when there is something to say);
 *   - runs COMMAND in work/ with stdout.log and stderr.log, its limits, no network, its own
 *     user and its own processes and mounts: ISOLATION is "net" (a new network namespace; as
 *     root), "userns" (a new user namespace mapping this user, and a network namespace in
 *     it), "join-net" or "join-userns" (enter the network namespace open on fd 4, and for the
 *     latter first the user namespace on fd 5: those its task's jobs share, made by
 *     `--namespaces`) or "none"; UID is "-" or the user (and group) to run as; each LIMIT is
 *     RESOURCE=SOFT:HARD with RESOURCE one of cpu, as, nofile, fsize, nproc, in setrlimit's
 *     units, or writable=PATH: a directory of the host the job may write in (the operator's
 *     WORKFLOW_ENGINE_JOB_WRITABLE_PATHS). Unless ISOLATION is "none", the job gets a PID namespace and a mount namespace
 *     of its own: a small init (this program, pid 1 there) starts the command and, when the
 *     command ends, exits, and the kernel then kills every process left in the namespace
 *     (a `setsid` child included); the job sees only its own processes (a fresh /proc), as
 *     /tmp and /dev/shm the directory TMP (its task's, which the engine made; "-" with
 *     ISOLATION "none"), an empty /run (no host socket lives in any of them for it), and in
 *     the jobs directory only its own job directory, and a System V IPC namespace and a
 *     UTS namespace (host name) of its own; every other file of the host read-only, but for
 *     the writable=PATH directories; in every case the command starts with no
 *     descriptor above 2 (whatever the engine held open without close-on-exec stays here),
 *     an empty session keyring of its own, no_new_privs (a setuid program it runs gains
 *     nothing), and a seccomp filter (`deny_kernel_paths`: the system calls no build or test
 *     needs that reach the kernel's less-travelled code are refused with EPERM);
 *   - while the engine lives (fd 3 stays open) it only waits; once fd 3 reads end of file it
 *     keeps the deadline itself (DEADLINE: whole seconds of CLOCK_BOOTTIME), or, for a
 *     cancelled job, GRACE seconds: then it writes timed_out (not for a cancel) and kills
 *     the job's whole process group, itself included;
 *   - a SIGTERM (a cancel) is acted on once the command has ended: the group is killed and
 *     no exit status is written;
 *   - writes the command's exit status (128 + the signal for a signal) to exit_status, then
 *     kills what is left of the group.
 *
 * `jobwrap --namespaces net|userns` serves the engine the namespaces each task's jobs share
 * instead (what "net" or "userns" make for one job): for each byte read from fd 3, a unix
 * socket of packets, it makes a set and answers with a packet of one byte carrying their
 * descriptors (the network namespace's, then the user namespace's) as SCM_RIGHTS, or of the
 * words saying why it could not; it exits when fd 3 reads end of file. A namespace lives as
 * long as a process is in it or a descriptor names it, so nothing is left to clean up.
 *
 * Exit statuses of its own: 95 a limit could not be set, 96 no job or work directory, 97
 * claimed already, 98 cancelled before it ran, 125 the job's namespaces, mounts or user could
 * not be set up; the command's 126/127 when it cannot be run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436 /* one number on every architecture (Linux 5.9) */
#endif
#define KEYCTL_JOIN_SESSION_KEYRING 1

#define ENGINE_PIPE 3
#define SHARED_NETNS 4
#define SHARED_USERNS 5
#define JOB_DATA 6
/* The most the job's data on fd 6 may hold (a request is at most a few MiB). */
#define MAX_JOB_DATA (64 << 20)
/* What the job's private /run and /dev/shm may hold; /tmp holds its output limit (fsize). */
#define SMALL_TMPFS "size=16m,nr_inodes=4096,mode=1777"

static volatile sig_atomic_t terminated;

static void on_term(int signum) {
    (void)signum;
    terminated = 1;
}

/* Close every descriptor from `first` on: what the engine's process held open without
 * close-on-exec (a socket activation's, a log pipe's) reaches no job. */
static void close_from(int first) {
    if (syscall(SYS_close_range, (unsigned)first, ~0U, 0) == 0) return;
    struct rlimit files; /* a kernel before 5.9: one at a time */
    long last = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                    ? (long)files.rlim_cur : 1 << 20;
    for (long fd = first; fd < last; fd++) close((int)fd);
}

/* Kill the job's process group, this process included: how every path ends. */
static void kill_group(void) {
    kill(0, SIGKILL);
    _exit(137); /* not reached */
}

/* Create (or truncate) `path` holding `text`; whether that worked. */
static int write_file(const char *path, const char *text, int flags) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0666);
    if (fd < 0) return 0;
    size_t left = strlen(text);
    while (left > 0) {
        ssize_t n = write(fd, text, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            close(fd);
            return 0;
        }
        text += n;
        left -= (size_t)n;
    }
    return close(fd) == 0;
}

/* Say why this job cannot go on, in supervisor.log (in the job directory, the current one),
 * which a lost job's result quotes; made only now, so that a job that goes well costs no file. */
static void complain(const char *format, ...) {
    int fd = open("supervisor.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return;
    va_list args;
    va_start(args, format);
    vdprintf(fd, format, args);
    va_end(args);
    close(fd);
}

static double boot_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static int set_limit(const char *word) {
    static const struct { const char *name; int resource; } names[] = {
        {"cpu", RLIMIT_CPU}, {"as", RLIMIT_AS}, {"nofile", RLIMIT_NOFILE},
        {"fsize", RLIMIT_FSIZE}, {"nproc", RLIMIT_NPROC},
    };
    const char *eq = strchr(word, '=');
    if (eq == NULL) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strlen(names[i].name) != (size_t)(eq - word) ||
            strncmp(word, names[i].name, (size_t)(eq - word)) != 0)
            continue;
        char *end;
        struct rlimit limit;
        limit.rlim_cur = strtoull(eq + 1, &end, 10);
        if (*end != ':') return 0;
        limit.rlim_max = strtoull(end + 1, &end, 10);
        return *end == '\0' && setrlimit(names[i].resource, &limit) == 0;
    }
    return 0;
}

/* A user namespace mapping this process's user and group onto themselves. */
static int map_current_user(uid_t uid, gid_t gid) {
    char map[64];
    if (!write_file("/proc/self/setgroups", "deny", O_TRUNC)) return 0;
    snprintf(map, sizeof map, "%u %u 1", (unsigned)uid, (unsigned)uid);
    if (!write_file("/proc/self/uid_map", map, O_TRUNC)) return 0;
    snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
    return write_file("/proc/self/gid_map", map, O_TRUNC);
}

/* Move this process into the namespaces ISOLATION names: NULL, or why it could not. */
static const char *isolate(const char *isolation) {
    static char why[160];
    int joining_user = strcmp(isolation, "join-userns") == 0;
    const char *failed;
    if (strcmp(isolation, "net") == 0) {
        if (unshare(CLONE_NEWNET) == 0) return NULL;
        failed = "no network namespace";
    } else if (strcmp(isolation, "userns") == 0) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0 && map_current_user(uid, gid)) return NULL;
        failed = "no user and network namespace";
    } else if (joining_user || strcmp(isolation, "join-net") == 0) {
        if ((!joining_user || setns(SHARED_USERNS, CLONE_NEWUSER) == 0) &&
            setns(SHARED_NETNS, CLONE_NEWNET) == 0) {
            close(SHARED_NETNS);
            if (joining_user) close(SHARED_USERNS);
            return NULL;
        }
        failed = "cannot enter the task's namespaces";
    } else if (strcmp(isolation, "none") == 0) {
        return NULL;
    } else {
        snprintf(why, sizeof why, "unknown isolation %s", isolation);
        return why;
    }
    snprintf(why, sizeof why, "%s: %s", failed, strerror(errno));
    return why;
}

/* One answer to the engine, one packet on fd 3: a byte with `count` descriptors, or `why`. */
static void answer(const int *fds, int count, const char *why) {
    char byte = 'n';
    struct iovec data = {why ? (void *)why : &byte, why ? strlen(why) : 1};
    union { /* aligned as a cmsghdr must be */
        char buffer[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr message = {0};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    if (count > 0) {
        message.msg_control = control.buffer;
        message.msg_controllen = CMSG_SPACE(count * sizeof(int));
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(count * sizeof(int));
        memcpy(CMSG_DATA(header), fds, count * sizeof(int));
    }
    while (sendmsg(ENGINE_PIPE, &message, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

/* Make one task's namespaces and send them: "net" in this process, which moves into each new
 * one (only the descriptor it sends keeps the last one alive), "userns" in a child (a process
 * makes only one user namespace of its own). */
static void make_namespaces(int userns) {
    pid_t child = userns ? fork() : 0;
    if (child < 0) {
        answer(NULL, 0, "jobwrap: cannot fork");
        return;
    }
    if (child > 0) {
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {
        }
        return;
    }
    const char *why = isolate(userns ? "userns" : "net");
    int fds[2] = {-1, -1};
    if (why == NULL) {
        fds[0] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        if (userns) fds[1] = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
        if (fds[0] < 0 || (userns && fds[1] < 0)) why = "cannot open its namespaces";
    }
    answer(fds, why ? 0 : (userns ? 2 : 1), why);
    if (userns) _exit(0);
    close(fds[0]);
}

/* `jobwrap --namespaces ISOLATION`: see the top of this file. */
static int serve_namespaces(const char *isolation) {
    int userns = strcmp(isolation, "userns") == 0;
    if (!userns && strcmp(isolation, "net") != 0) {
        answer(NULL, 0, "jobwrap: --namespaces takes net or userns");
        return 2;
    }
    char request;
    ssize_t n;
    while ((n = read(ENGINE_PIPE, &request, 1)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 1;
        make_namespaces(userns);
    }
    return 0; /* the engine is gone, or let go of this helper */
}

/* The job's data from fd 6 (see the top of this file): the request's JSON, returned, and
 * the command's environment in `*env`; NULL when it cannot be read. */
static char *read_job(char ***env) {
    size_t size = 0, room = 1 << 16;
    char *data = malloc(room + 1);
    while (data != NULL) {
        if (size == room) {
            char *bigger = room < MAX_JOB_DATA ? realloc(data, 2 * room + 1) : NULL;
            if (bigger == NULL) break;
            data = bigger;
            room *= 2;
        }
        ssize_t n = read(JOB_DATA, data + size, room - size);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        if (n == 0) {
            close(JOB_DATA);
            data[size] = '\0';
            char *end = data + size, *first = memchr(data, '\0', size);
            first = first == NULL ? end : first + 1;
            size_t count = 0;
            for (char *entry = first; entry < end; entry += strlen(entry) + 1) count++;
            char **vars = calloc(count + 1, sizeof *vars);
            if (vars == NULL) break;
            count = 0;
            for (char *entry = first; entry < end; entry += strlen(entry) + 1) vars[count++] = entry;
            *env = vars;
            return data;
        }
        size += (size_t)n;
    }
    free(data);
    return NULL;
}

/* Mount `what` (a tmpfs when `fd` < 0, else a bind of the directory open on `fd`) on `where`,
 * if there is such a directory; whether that worked (or there is none). */
static int cover(const char *where, int fd, const char *options) {
    struct stat seen;
    if (stat(where, &seen) != 0) return errno == ENOENT;
    if (!S_ISDIR(seen.st_mode)) return 1;
    if (fd >= 0) {
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
        return mount(source, where, NULL, MS_BIND, NULL) == 0;
    }
    return mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, options) == 0;
}

/* Whether `path` is `dir` or beneath it. */
static int beneath(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* `mkdir -p path` as root where the job's user may have written first (its /tmp, a task's
 * directory its earlier jobs wrote in): each component is made and entered without following
 * a symbolic link, so a link a job planted cannot send root's mkdir elsewhere on the host. The
 * directory, open (O_PATH), or -1. */
static int make_path(const char *path) {
    char parts[PATH_MAX];
    if (snprintf(parts, sizeof parts, "%s", path) >= (int)sizeof parts) return -1;
    int dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *save = NULL;
    for (char *part = strtok_r(parts, "/", &save); part != NULL && dir >= 0;
         part = strtok_r(NULL, "/", &save)) {
        int next = -1;
        if (mkdirat(dir, part, 0711) == 0 || errno == EEXIST)
            next = openat(dir, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(dir);
        dir = next;
    }
    return dir;
}

/* Bind the directory open on `fd` onto the directory open on `onto`; whether that worked. */
static int bind_onto(int fd, int onto) {
    char source[64], target[64];
    snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
    snprintf(target, sizeof target, "/proc/self/fd/%d", onto);
    return mount(source, target, NULL, MS_BIND, NULL) == 0;
}

/* open_tree(2), move_mount(2) (Linux 5.2) and mount_setattr(2) (5.12), without kernel
 * headers: one number each on every architecture. */
#define SYS_open_tree_ 428
#define SYS_move_mount_ 429
#define SYS_mount_setattr_ 442
#define OPEN_TREE_CLONE_ 1
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4
#define MOVE_MOUNT_T_EMPTY_PATH_ 0x40
#define MOUNT_ATTR_RDONLY 0x1ULL
#define AT_RECURSIVE_ 0x8000
struct mount_attr_ { unsigned long long attr_set, attr_clr, propagation, userns_fd; };

/* Set (or clear) read-only on the mount `dir` (a descriptor) is in, and with `recursive` on
 * every mount beneath it. */
static int set_read_only(int dir, int recursive, int read_only) {
    struct mount_attr_ attr = {0};
    if (read_only) attr.attr_set = MOUNT_ATTR_RDONLY;
    else attr.attr_clr = MOUNT_ATTR_RDONLY;
    return (int)syscall(SYS_mount_setattr_, dir, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE_ : 0),
                        &attr, sizeof attr);
}

/* `path` opened (O_PATH) without following a symbolic link at any component, so a link a job
 * planted (in a granted directory, in its task's /tmp) cannot send root elsewhere; -1 with
 * errno set (ENOTDIR for a link). A mount on the last component is entered. */
static int open_no_links(const char *path) {
    char parts[PATH_MAX];
    if (snprintf(parts, sizeof parts, "%s", path) >= (int)sizeof parts) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *save = NULL;
    for (char *part = strtok_r(parts, "/", &save); part != NULL && dir >= 0;
         part = strtok_r(NULL, "/", &save)) {
        int next = openat(dir, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int failure = errno;
        close(dir);
        errno = failure;
        dir = next;
    }
    return dir;
}

/* The writable=PATH arguments: host directories the operator lets every job write in. */
static char **granted_paths;
static int granted_count;

/* The host's files read-only for the job, but for its own mounts (`own`: its /tmp, its job
 * directory...) and the directories the operator granted: it writes only where it was given
 * room, never into a world-writable directory of the host that another tenant's job could
 * read. Every path is walked without following links and acted on through its descriptor. A
 * granted directory gets a mount of its own (a clone of the tree there, attached on top) whose
 * top alone is made writable again: a read-only filesystem mounted beneath it stays so. A
 * kernel before 5.12 has no mount_setattr: the host's files stay as the job's user sees them
 * there. 1, or 0 with errno set. */
static int read_only_host(const char *const *own, int count) {
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return 0;
    int done = set_read_only(root, 1, 1) == 0;
    close(root);
    if (!done) return errno == ENOSYS;
    for (int i = 0; i < count; i++) {
        int dir = open_no_links(own[i]);
        if (dir < 0 && errno == ENOENT) continue; /* not covered */
        if (dir < 0) return 0;
        done = set_read_only(dir, 0, 0) == 0;
        close(dir);
        if (!done) return 0;
    }
    for (int i = 0; i < granted_count; i++) {
        int dir = open_no_links(granted_paths[i]);
        if (dir < 0 && errno == ENOENT) continue; /* none on this host */
        if (dir < 0) return 0;
        int tree = (int)syscall(SYS_open_tree_, dir, "",
                                OPEN_TREE_CLONE_ | O_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE_);
        done = tree >= 0 && set_read_only(tree, 0, 0) == 0 &&
               syscall(SYS_move_mount_, tree, "", dir, "",
                       MOVE_MOUNT_F_EMPTY_PATH_ | MOVE_MOUNT_T_EMPTY_PATH_) == 0;
        int failure = errno;
        if (tree >= 0) close(tree);
        close(dir);
        errno = failure;
        if (!done) return 0;
    }
    return 1;
}

/* In the job's init, in its new PID namespace: give the job a mount namespace of its own in
 * which /tmp and /dev/shm are its task's directory `tmp_dir` (shared by the task's jobs
 * alone), /run is empty, the jobs directory holds its own job directory only, /proc shows
 * its own processes, and every other file of the host is read-only. NULL, or what failed. */
static const char *contain(const char *job_dir, const char *tmp_dir, int in_userns) {
    static char why[PATH_MAX + 80];
    char path[PATH_MAX];
    const char *failed = NULL;
    umask(022); /* what `make_path` makes, the job's user must be able to pass through */
    if (unshare(CLONE_NEWNS) != 0) return "no mount namespace";
    /* Opened in the new namespace (a bind's source must be in it), before anything hides them */
    int job = open(job_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int tmp = open(tmp_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *jobs = strdup(job_dir), *cut = jobs ? strrchr(jobs, '/') : NULL;
    if (job < 0 || tmp < 0 || cut == NULL || cut == jobs) {
        failed = "cannot open its job directory and its task's tmp directory";
    } else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        failed = "cannot make its mounts private";
    } else if (!cover("/tmp", tmp, NULL) || !cover("/dev/shm", tmp, NULL) ||
               !cover("/run", -1, "size=1m,nr_inodes=256,mode=755")) {
        failed = "cannot make /tmp, /dev/shm and /run its own";
    } else {
        *cut = '\0';
        int hidden = beneath(jobs, "/tmp") || beneath(jobs, "/dev/shm") || beneath(jobs, "/run");
        int jobs_dir = -1, onto = -1;
        if (hidden ? (jobs_dir = make_path(jobs)) < 0
                   : !cover(jobs, -1, "size=1m,nr_inodes=256,mode=711"))
            failed = "cannot hide the other jobs";
        else if ((onto = make_path(job_dir)) < 0 || !bind_onto(job, onto))
            failed = "cannot show its own job directory";
        /* A container that masks parts of /proc lets no user namespace mount a fresh one:
         * there (the engine is not root) the job gets an empty /proc rather than the host's. */
        else if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0 &&
                 !(in_userns && cover("/proc", -1, "size=4k,nr_inodes=16,mode=555")))
            failed = "cannot mount its own /proc";
        else if (!read_only_host((const char *const[]){"/tmp", "/dev/shm", "/run", "/proc",
                                                         job_dir}, 5))
            failed = "cannot make the host's files read-only";
        else if (snprintf(path, sizeof path, "%s/work", job_dir) >= (int)sizeof path ||
                 chdir(path) != 0)
            failed = "cannot enter work/";
        int failure = errno;
        if (jobs_dir >= 0) close(jobs_dir);
        if (onto >= 0) close(onto);
        errno = failure;
    }
    int saved = errno;
    free(jobs);
    if (job >= 0) close(job);
    if (tmp >= 0) close(tmp);
    if (failed == NULL) return NULL;
    snprintf(why, sizeof why, "%s: %s", failed, strerror(saved));
    return why;
}

/* The seccomp filter every command runs under (x86_64 and arm64; elsewhere none): a list of
 * what it may not do, as Docker's default profile is in spirit, since a job's commands are
 * any program (compilers, package managers, test runners) and an allow-list would refuse what
 * one of them needs. Refused with EPERM: new namespaces (unshare, setns, and clone with a
 * namespace flag; clone3, whose flags a filter cannot read, is ENOSYS, so the C library falls
 * back to clone), mounts of every kind, the kernel's keyrings, bpf, perf_event_open,
 * userfaultfd, io_uring, file handles (open_by_handle_at: a classic container escape), and the
 * administrator's calls (modules, kexec, reboot, swap, clocks, accounting, quotas, the kernel
 * log, port I/O), which its user could not make anyway. A system call of another ABI (32-bit
 * x86, x32) kills the process: the numbers below would not be what it asks for. ptrace of
 * its own processes stays. These header-free definitions are the kernel's stable ABI
 * (linux/filter.h, linux/seccomp.h, linux/audit.h), which musl's headers do not carry. */
struct bpf_insn { unsigned short code; unsigned char jt, jf; unsigned int k; };
struct bpf_program { unsigned short len; struct bpf_insn *filter; };
#define LD_W_ABS 0x20   /* BPF_LD | BPF_W | BPF_ABS */
#define JEQ_K 0x15      /* BPF_JMP | BPF_JEQ | BPF_K */
#define JGE_K 0x35      /* BPF_JMP | BPF_JGE | BPF_K */
#define JSET_K 0x45     /* BPF_JMP | BPF_JSET | BPF_K */
#define RET_K 0x06      /* BPF_RET | BPF_K */
#define RET_ALLOW 0x7fff0000U
#define RET_KILL_PROCESS 0x80000000U
#define RET_ERRNO(e) (0x00050000U | ((e) & 0xffffU))
#define SECCOMP_DATA_NR 0
#define SECCOMP_DATA_ARCH 4
#define SECCOMP_DATA_ARG0_LOW 16 /* little-endian: the low half of args[0] */
#define NAMESPACE_FLAGS 0x7e020080U /* CLONE_NEWNS, _NEWCGROUP, _NEWUTS, _NEWIPC, _NEWUSER,
                                       _NEWPID, _NEWNET, _NEWTIME */
#if defined(__x86_64__)
#define FILTER_ARCH 0xc000003eU /* AUDIT_ARCH_X86_64 */
#define FOREIGN_NR 0x40000000U  /* __X32_SYSCALL_BIT */
#elif defined(__aarch64__)
#define FILTER_ARCH 0xc00000b7U /* AUDIT_ARCH_AARCH64 */
#define FOREIGN_NR 0xffffffffU
#endif

#ifdef FILTER_ARCH
static const long denied_calls[] = {
    SYS_unshare, SYS_setns, SYS_mount, SYS_umount2, SYS_pivot_root, SYS_keyctl, SYS_add_key,
    SYS_request_key, SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_open_by_handle_at,
    SYS_name_to_handle_at, SYS_init_module, SYS_finit_module, SYS_delete_module,
    SYS_kexec_load, SYS_reboot, SYS_swapon, SYS_swapoff, SYS_acct, SYS_quotactl, SYS_syslog,
    SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex, SYS_vhangup,
    SYS_fanotify_init, SYS_lookup_dcookie,
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
#ifdef SYS_iopl
    SYS_iopl, SYS_ioperm,
#endif
#ifdef SYS_io_uring_setup
    SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
#endif
#ifdef SYS_open_tree
    SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
#endif
#ifdef SYS_mount_setattr
    SYS_mount_setattr,
#endif
};
#define DENIED (sizeof denied_calls / sizeof denied_calls[0])
#endif

/* Install the filter; 0, or -1 with errno set. */
static int deny_kernel_paths(void) {
#ifdef FILTER_ARCH
    struct bpf_insn prog[2 * DENIED + 16];
    unsigned n = 0;
#define INSN(c, t, f, v) (prog[n++] = (struct bpf_insn){(c), (t), (f), (v)})
    INSN(LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH);
    INSN(JEQ_K, 1, 0, FILTER_ARCH);
    INSN(RET_K, 0, 0, RET_KILL_PROCESS);
    INSN(LD_W_ABS, 0, 0, SECCOMP_DATA_NR);
    INSN(JGE_K, 0, 1, FOREIGN_NR);
    INSN(RET_K, 0, 0, RET_KILL_PROCESS);
    for (unsigned i = 0; i < DENIED; i++) {
        INSN(JEQ_K, 0, 1, (unsigned)denied_calls[i]);
        INSN(RET_K, 0, 0, RET_ERRNO(EPERM));
    }
#ifdef SYS_clone3
    INSN(JEQ_K, 0, 1, SYS_clone3);
    INSN(RET_K, 0, 0, RET_ERRNO(ENOSYS));
#endif
    INSN(JEQ_K, 0, 3, SYS_clone);
    INSN(LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0_LOW);
    INSN(JSET_K, 0, 1, NAMESPACE_FLAGS);
    INSN(RET_K, 0, 0, RET_ERRNO(EPERM));
    INSN(RET_K, 0, 0, RET_ALLOW);
#undef INSN
    struct bpf_program program = {(unsigned short)n, prog};
    return prctl(PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &program, 0, 0);
#else
    return 0;
#endif
}

/* In the forked command: become the job (limits, user, environment, files) and exec it. */
static void run_command(char **command, char **env, const char *user, int nlimits,
                        char **limits, int out, int err) {
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int i = 0; i < nlimits; i++) {
        if (!set_limit(limits[i])) {
            dprintf(err, "jobwrap: cannot set the limit %s: %s\n", limits[i], strerror(errno));
            _exit(95);
        }
    }
    if (strcmp(user, "-") != 0) {
        uid_t id = (uid_t)strtoul(user, NULL, 10);
        if (setgroups(0, NULL) != 0 || setgid(id) != 0 || setuid(id) != 0) {
            dprintf(err, "jobwrap: cannot become user %s: %s\n", user, strerror(errno));
            _exit(125);
        }
    }
    /* A session keyring of its own, empty: the engine's (systemd gives each service one;
     * Kerberos keeps tickets there) would be the job's to read, as its possessor. Where the
     * kernel has no keyrings, or a seccomp filter forbids keyctl, the job cannot use them
     * either. A job that runs as the engine's own user (UID "-", the engine not root) could
     * read that user's keys anyway, and shares its key quota with every other such job: there
     * a keyring that cannot be had (the quota full) does not stop the job. */
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0 && errno != ENOSYS &&
        errno != EPERM && strcmp(user, "-") != 0) {
        dprintf(err, "jobwrap: cannot give the job a keyring of its own: %s\n", strerror(errno));
        _exit(125);
    }
    /* No setuid or file-capability program the job runs gains a privilege it lacks. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        dprintf(err, "jobwrap: cannot set no_new_privs: %s\n", strerror(errno));
        _exit(125);
    }
    if (deny_kernel_paths() != 0) {
        dprintf(err, "jobwrap: cannot install the seccomp filter: %s\n", strerror(errno));
        _exit(125);
    }
    umask(022);
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(125);
    close_from(3); /* out, err, the engine's pipe and whatever else this process holds */
    environ = env; /* only now, as the job's user: what the caller wrote is the job's alone */
    execvp(command[0], command);
    int failure = errno;
    fprintf(stderr, "jobwrap: cannot run %s: %s\n", command[0], strerror(failure));
    _exit(failure == ENOENT ? 127 : 126);
}

static void forward_term(int signum) {
    (void)signum;
    kill(-1, SIGTERM); /* from pid 1: every other process of the job's PID namespace */
}

/* The job's init, pid 1 of its PID namespace: contain the job, start the command, reap
 * whatever ends, and exit with the command's status as soon as it ends, which makes the kernel
 * kill every process left in the namespace. A SIGTERM (a cancel) is passed on to them all. */
static void be_init(const char *job_dir, const char *tmp, int in_userns, char **command,
                    char **env,
                    const char *user, int nlimits, char **limits, int out, int err) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the wrapper gone (killed): the whole job goes */
    close(ENGINE_PIPE);
    const char *why = contain(job_dir, tmp, in_userns);
    if (why != NULL) {
        dprintf(err, "jobwrap: %s\n", why);
        _exit(125);
    }
    struct sigaction term = {0};
    term.sa_handler = forward_term;
    sigaction(SIGTERM, &term, NULL);
    pid_t command_pid = fork(); /* SIGTERM is blocked until the command exists to get it */
    if (command_pid < 0) {
        dprintf(err, "jobwrap: cannot fork: %s\n", strerror(errno));
        _exit(125);
    }
    if (command_pid == 0) run_command(command, env, user, nlimits, limits, out, err);
    close(out);
    close(err);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (;;) {
        int status;
        pid_t ended = waitpid(-1, &status, 0);
        if (ended < 0 && errno == EINTR) continue;
        if (ended < 0) _exit(125);
        if (ended == command_pid)
            _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--namespaces") == 0) {
        close_from(ENGINE_PIPE + 1);
        return serve_namespaces(argv[2]);
    }
    close_from(JOB_DATA + 1); /* fds 0 to 6 are the engine's protocol; anything above, a leak */
    if (argc < 8) {
        fprintf(stderr, "usage: jobwrap JOB_DIR DEADLINE GRACE ISOLATION UID TMP LIMIT... -- COMMAND...\n"
                        "       jobwrap --namespaces net|userns\n");
        return 2;
    }
    const char *job_dir = argv[1];
    long long deadline = strtoll(argv[2], NULL, 10);
    double grace = strtod(argv[3], NULL);
    const char *isolation = argv[4];
    const char *user = argv[5];
    const char *tmp = argv[6];
    char **limits = argv + 7;
    int nlimits = 0;
    while (7 + nlimits < argc && strcmp(limits[nlimits], "--") != 0) nlimits++;
    char **command = limits + nlimits + 1;
    if (7 + nlimits + 1 >= argc) {
        fprintf(stderr, "jobwrap: no command after --\n");
        return 2;
    }
    /* The writable=PATH arguments are no limits: set them aside (`read_only_host`). */
    char *granted[nlimits > 0 ? nlimits : 1];
    int kept = 0;
    for (int i = 0; i < nlimits; i++) {
        if (strncmp(limits[i], "writable=", 9) == 0 && limits[i][9] == '/')
            granted[granted_count++] = limits[i] + 9;
        else
            limits[kept++] = limits[i];
    }
    granted_paths = granted;
    nlimits = kept;

    if (chdir(job_dir) != 0) return 96;
    umask(077);
    char pid[32];
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (!write_file("supervisor.pid", pid, O_EXCL)) return 97;

    struct sigaction term = {0};
    term.sa_handler = on_term; /* no SA_RESTART: a SIGTERM wakes the wait below */
    sigaction(SIGTERM, &term, NULL);
    if (terminated) kill_group();
    if (access("cancel", F_OK) == 0) return 98;
    char **env = NULL;
    char *request = read_job(&env);
    if (request == NULL) {
        complain("jobwrap: cannot read the job from fd %d: %s\n", JOB_DATA, strerror(errno));
        return 96;
    }
    size_t line_size = strlen(request) + 2;
    char *line = malloc(line_size);
    if (line == NULL) return 96;
    snprintf(line, line_size, "%s\n", request);
    write_file("request.json", line, O_TRUNC);
    free(line);
    /* work/, its working directory, is the job's user's, and only that */
    if (mkdir("work", 0700) != 0 && errno != EEXIST) {
        complain("jobwrap: cannot make work/: %s\n", strerror(errno));
        return 96;
    }
    if (strcmp(user, "-") != 0) {
        uid_t id = (uid_t)strtoul(user, NULL, 10);
        if (chown("work", id, id) != 0) {
            complain("jobwrap: cannot give work/ to user %s: %s\n", user, strerror(errno));
            return 96;
        }
    }
    if (chdir("work") != 0) {
        complain("jobwrap: cannot enter work/: %s\n", strerror(errno));
        return 96;
    }
    int out = open("../stdout.log", O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int err = open("../stderr.log", O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (out < 0 || err < 0) {
        complain("jobwrap: cannot make stdout.log and stderr.log: %s\n", strerror(errno));
        return 96;
    }
    if (terminated) kill_group();

    /* Into the job's namespaces: its network (and user) namespace, and a PID namespace whose
     * first process, forked next, is the job's init. This process stays outside it. */
    int contained = strcmp(isolation, "none") != 0;
    const char *why = isolate(isolation);
    char no_pid_namespace[128];
    /* With its own PID namespace, its own System V IPC (no segment of another job's or the
     * host's PostgreSQL's is visible, and its own go with it) and its own host name. */
    if (why == NULL && contained && unshare(CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) != 0) {
        snprintf(no_pid_namespace, sizeof no_pid_namespace, "no PID, IPC and UTS namespace: %s",
                 strerror(errno));
        why = no_pid_namespace;
    }
    pid_t child = -1;
    if (why == NULL) {
        sigset_t term, before;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigprocmask(SIG_BLOCK, &term, &before); /* the init's own handler takes over */
        child = fork();
        if (child == 0 && contained)
            be_init(job_dir, tmp, strstr(isolation, "userns") != NULL, command, env, user,
                    nlimits, limits, out, err);
        if (child == 0) run_command(command, env, user, nlimits, limits, out, err);
        sigprocmask(SIG_SETMASK, &before, NULL);
        if (child < 0) {
            complain("jobwrap: cannot fork: %s\n", strerror(errno));
            return 96;
        }
    } else {
        dprintf(err, "jobwrap: %s\n", why);
    }
    close(out);
    close(err);
    if (child < 0) { /* nothing ran: the job failed as a command that cannot start would */
        umask(022);
        write_file("../exit_status", "125\n", O_TRUNC);
        kill_group();
    }

    /* Wait for the command; once the engine is gone, keep its deadline (or a cancel's grace). */
    int exited = (int)syscall(SYS_pidfd_open, child, 0);
    int engine_alive = 1;
    double until = 0;
    int keeping_deadline = 0;
    while (exited >= 0) {
        struct pollfd watched[2] = {{exited, POLLIN, 0}, {ENGINE_PIPE, POLLIN, 0}};
        int timeout = -1;
        if (!engine_alive) {
            double left = until - boot_seconds();
            timeout = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        int ready = poll(watched, engine_alive ? 2 : 1, timeout);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) break;
        if (watched[0].revents) break;
        if (engine_alive && watched[1].revents) {
            char byte;
            if (read(ENGINE_PIPE, &byte, 1) > 0) continue;
            engine_alive = 0;
            keeping_deadline = access("../cancel", F_OK) != 0;
            until = keeping_deadline ? (double)deadline : boot_seconds() + grace;
            continue;
        }
        if (ready == 0) {
            if (keeping_deadline) write_file("../timed_out", "", O_TRUNC);
            kill_group();
        }
    }
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) kill_group();
    }
    if (terminated) kill_group();
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char text[16];
    snprintf(text, sizeof text, "%d\n", code);
    umask(022);
    write_file("../exit_status", text, O_TRUNC);
    kill_group();
}
