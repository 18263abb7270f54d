/*
 * A test NVML: a libnvidia-ml.so.1 for machines without a GPU.
 *
 * Compiled against NVIDIA's own nvml.h (PyPI package nvidia-nvml-dev) so every prototype and struct layout is
 * checked by the compiler, and loaded by nvidia-ml-py (pynvml) through its real ctypes code path. The node it
 * describes lives in a text file named by $VRAMGUARD_FAKE_NVML_STATE; tests change the node by replacing that
 * file (write a temporary file, then rename it over the old one). vramguard_testbed.fakenvml writes it.
 *
 * The file is consulted on every call: a stat() each time, and a re-parse whenever the file's identity (device,
 * inode, size, mtime, ctime) changed. A rename always brings a new inode, so a replaced file is never missed,
 * and an unchanged one costs one syscall, which keeps the benchmark of a warm scan honest. The variable itself
 * is read at each nvmlInit (the latest one wins when several users share the library in one process).
 *
 * No state: when the variable is unset, the file is missing, or it does not parse, the fake behaves as a node
 * whose NVIDIA kernel driver is not loaded: nvmlInit and every other call return NVML_ERROR_DRIVER_NOT_LOADED
 * (NVML_ERROR_UNKNOWN for a file that does not parse, with the reason on stderr). A node with no GPUs is a state
 * file with no gpu lines.
 *
 * State format: one directive per line, fields separated by blanks, '#' starts a comment line.
 *
 *   init_error <code>                     nvmlInit* returns <code>
 *   driver_version <string>               default 550.54.15
 *   nvml_version <string>                 default 12.550.54.15
 *   cuda_driver_version <int>             default 12040
 *   memory_v2 <0|1>                       0: nvmlDeviceGetMemoryInfo_v2 returns NVML_ERROR_FUNCTION_NOT_FOUND,
 *                                         as the R510.39 driver did (default 1)
 *   r535_layout <0|1>                     1: the _v3 process functions write 32-byte rows (pid, used, gi, ci,
 *                                         ccProtected), as R535.43-535.86 did, into a caller's array of 24-byte
 *                                         nvmlProcessInfo_t (default 0)
 *   drop_dead_pids <0|1>                  1: process lists omit PIDs that are gone or zombies in /proc, as the
 *                                         driver frees a process's memory when it exits (default 0)
 *   gpu <index> <mig> <total> <used> <free> <reserved> <uuid> <name...>
 *                                         <mig>: on | off | na (MIG not supported); indexes 0..n-1
 *   mig <gpu> <slot> <gi> <ci> <total> <used> <free> <reserved> <uuid> <name...>
 *   proc <device> <compute|graphics|mps> <pid> <used|na>
 *                                         <device>: N (GPU N) or N/M (MIG slot M of GPU N); na reports
 *                                         NVML_VALUE_NOT_AVAILABLE
 *   memory_limits <0|1>                   1: the driver supports per-cgroup memory limits (R615+):
 *                                         nvmlDeviceSetMemoryLimits_v1 and nvmlDeviceGetMemoryLimits_v1 work on
 *                                         whole GPUs; 0: both return NVML_ERROR_NOT_SUPPORTED (default 0). A build
 *                                         with -DFAKE_NO_MEMORY_LIMITS lacks both symbols, as drivers before R615
 *   allocations <0|1>                     1: processes that called vgFakeAllocate hold that memory: process lists
 *                                         and memory info count it (default 0)
 *   error <function|*> <device|*> <code>  the function returns <code>
 *   hang <function|*> <device|*> <seconds>
 *                                         the function sleeps, then proceeds; the sleep ends early once the
 *                                         hang is no longer in the state, so a test can release a stuck call
 *
 * A fault's <device> N matches GPU N and its MIG instances, N/M only MIG slot M of GPU N, and * every call,
 * including those with no device (nvmlInit, nvmlDeviceGetCount). Memory figures are bytes.
 *
 * Beside the state file, shared by every process that uses the library (the agent, the test, the simulated
 * workloads), the driver's own mutable state lives in files next to it, each line one record, updated under
 * flock(2):
 *   <state>.limits   <gpu> <soft> <hard> <cgroup path>   the limits set (a cleared limit has no line)
 *   <state>.alloc    <gpu> <pid> <bytes>                 what vgFakeAllocate granted (a dead PID's is freed)
 *   <state>.calls    one line per limits call:
 *                    "set|get <gpu> <soft> <hard> <return code> <CLOCK_BOOTTIME seconds> <cgroup path>"
 *
 * Memory limits follow nvml.h and NVIDIA's dmem documentation: the cgroup path is a cgroup v2 directory (its full
 * sysfs path as this process sees it); a process is in it when its "0::" cgroup is the directory or below it; an
 * allocation that would take a limited cgroup — the process's own or any parent: a pod's limit bounds every
 * container below it — over its hard limit fails (NVML_ERROR_MEMORY, standing for CUDA's out-of-memory) in that
 * process only; and nvmlDeviceGetMemoryInfo reports a limit as the device's total only to a process whose own
 * (leaf) cgroup holds it, as NVIDIA documents for cuMemGetInfo.
 */

#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define FAKE_EXPORT __attribute__((visibility("default")))
#define FAKE_MAX_GPUS 64
#define FAKE_MAX_MIG 8
#define FAKE_MAX_FAULTS 64
#define FAKE_NAME_LEN 96
#define FAKE_ANY (-1)
#define FAKE_NO_DEVICE (-2)

enum fake_kind { KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS };

/* Handles are addresses in these arrays, so a handle a caller cached stays valid across state reloads; it
 * names a (gpu, mig) slot, and each call looks the slot up in the current state. */
struct nvmlDevice_st {
    int gpu;
    int mig; /* -1 for the whole GPU */
};
static struct nvmlDevice_st g_gpu_handles[FAKE_MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[FAKE_MAX_GPUS][FAKE_MAX_MIG];

typedef struct {
    unsigned long long total, used, free, reserved;
} fake_memory;

typedef struct {
    int present;
    unsigned int gi, ci;
    fake_memory memory;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[FAKE_NAME_LEN];
} fake_mig;

typedef struct {
    int present;
    int mig_supported;
    int mig_enabled;
    fake_memory memory;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[FAKE_NAME_LEN];
    fake_mig migs[FAKE_MAX_MIG];
} fake_gpu;

typedef struct {
    int gpu, mig;
    enum fake_kind kind;
    unsigned int pid;
    unsigned long long used;
} fake_proc;

typedef struct {
    char function[128]; /* "*" for any */
    int gpu, mig;       /* FAKE_ANY for any */
    int is_hang;
    long code;
    double seconds;
} fake_fault;

typedef struct {
    nvmlReturn_t init_error;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    int memory_v2, r535_layout, drop_dead_pids, memory_limits, allocations;
    unsigned int gpu_count;
    fake_gpu gpus[FAKE_MAX_GPUS];
    fake_proc *procs;
    size_t nprocs, procs_cap;
    fake_fault faults[FAKE_MAX_FAULTS];
    int nfaults;
} fake_state;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fake_state *g_state;         /* NULL: no usable state */
static nvmlReturn_t g_state_error = NVML_ERROR_DRIVER_NOT_LOADED;
static char g_env_path[PATH_MAX]; /* $VRAMGUARD_FAKE_NVML_STATE as of the last nvmlInit */
static char g_path[PATH_MAX];      /* the file g_state was parsed from */
static struct stat g_stat;
static int g_have_stat;
static unsigned int g_init_count;

/* ---------------------------------------------------------------------------------------------------------- */
/* Parsing */

static void state_free(fake_state *s)
{
    if (s) {
        free(s->procs);
        free(s);
    }
}

static int parse_u64(const char *text, unsigned long long *out)
{
    char *end;
    if (!text || !*text || *text == '-')
        return -1;
    errno = 0;
    *out = strtoull(text, &end, 10);
    return (errno || *end) ? -1 : 0;
}

static int parse_int(const char *text, long lo, long hi, long *out)
{
    char *end;
    if (!text || !*text)
        return -1;
    errno = 0;
    *out = strtol(text, &end, 10);
    return (errno || *end || *out < lo || *out > hi) ? -1 : 0;
}

/* "N", "N/M" or, where allowed, "*". */
static int parse_device(const char *text, int allow_any, int *gpu, int *mig)
{
    long g, m;
    char buf[32], *slash;
    if (allow_any && strcmp(text, "*") == 0) {
        *gpu = *mig = FAKE_ANY;
        return 0;
    }
    if (strlen(text) >= sizeof buf)
        return -1;
    strcpy(buf, text);
    slash = strchr(buf, '/');
    if (slash)
        *slash = '\0';
    if (parse_int(buf, 0, FAKE_MAX_GPUS - 1, &g))
        return -1;
    *gpu = (int)g;
    *mig = -1;
    if (slash) {
        if (parse_int(slash + 1, 0, FAKE_MAX_MIG - 1, &m))
            return -1;
        *mig = (int)m;
    }
    return 0;
}

static int parse_memory(char **f, fake_memory *m)
{
    return parse_u64(f[0], &m->total) || parse_u64(f[1], &m->used) || parse_u64(f[2], &m->free) ||
           parse_u64(f[3], &m->reserved);
}

static void copy_text(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

#define MAX_FIELDS 16

/* Splits a line into at most `want` blank-separated fields; the last one keeps the rest of the line (names
 * contain blanks). Returns the number of fields found. */
static int split(char *line, char **f, int want)
{
    int n = 0;
    char *p = line;
    while (n < want) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        f[n++] = p;
        if (n == want)
            break;
        while (*p && *p != ' ' && *p != '\t')
            p++;
        if (*p)
            *p++ = '\0';
    }
    return n;
}

static int parse_flag(const char *text, int *out)
{
    long v;
    if (parse_int(text, 0, 1, &v))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_line(fake_state *s, char *line, char *why, size_t why_len)
{
    char *f[MAX_FIELDS], *word, *rest;
    int n = split(line, f, 2);
    long v;

    if (n == 0 || f[0][0] == '#')
        return 0;
    word = f[0];
    rest = n == 2 ? f[1] : line + strlen(line);
    /* Arguments land in f[1..]. A directive that ends with a name splits into exactly its arity, so the name
     * keeps its blanks; the others ask for one field more than they take, which catches extra fields. */
    if (strcmp(word, "gpu") == 0) {
        fake_gpu *g;
        if (split(rest, f + 1, 8) != 8 || parse_int(f[1], 0, FAKE_MAX_GPUS - 1, &v))
            goto bad;
        g = &s->gpus[v];
        if (g->present)
            goto bad;
        g->present = 1;
        if (strcmp(f[2], "on") == 0)
            g->mig_supported = g->mig_enabled = 1;
        else if (strcmp(f[2], "off") == 0)
            g->mig_supported = 1;
        else if (strcmp(f[2], "na") != 0)
            goto bad;
        if (parse_memory(f + 3, &g->memory))
            goto bad;
        copy_text(g->uuid, sizeof g->uuid, f[7]);
        copy_text(g->name, sizeof g->name, f[8]);
        if ((unsigned int)v + 1 > s->gpu_count)
            s->gpu_count = (unsigned int)v + 1;
        return 0;
    }
    if (strcmp(word, "mig") == 0) {
        long gpu, slot, gi, ci;
        fake_mig *m;
        if (split(rest, f + 1, 10) != 10 || parse_int(f[1], 0, FAKE_MAX_GPUS - 1, &gpu) ||
            parse_int(f[2], 0, FAKE_MAX_MIG - 1, &slot) || parse_int(f[3], 0, 0x7fffffffL, &gi) ||
            parse_int(f[4], 0, 0x7fffffffL, &ci))
            goto bad;
        m = &s->gpus[gpu].migs[slot];
        if (m->present)
            goto bad;
        m->present = 1;
        m->gi = (unsigned int)gi;
        m->ci = (unsigned int)ci;
        if (parse_memory(f + 5, &m->memory))
            goto bad;
        copy_text(m->uuid, sizeof m->uuid, f[9]);
        copy_text(m->name, sizeof m->name, f[10]);
        return 0;
    }
    if (strcmp(word, "proc") == 0) {
        fake_proc p;
        long pid;
        if (split(rest, f + 1, 5) != 4 || parse_device(f[1], 0, &p.gpu, &p.mig))
            goto bad;
        if (strcmp(f[2], "compute") == 0)
            p.kind = KIND_COMPUTE;
        else if (strcmp(f[2], "graphics") == 0)
            p.kind = KIND_GRAPHICS;
        else if (strcmp(f[2], "mps") == 0)
            p.kind = KIND_MPS;
        else
            goto bad;
        /* PIDs are not range-checked: a test may list an impossible one on purpose. */
        if (parse_int(f[3], 0, 0xffffffffL, &pid))
            goto bad;
        p.pid = (unsigned int)pid;
        if (strcmp(f[4], "na") == 0)
            p.used = (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
        else if (parse_u64(f[4], &p.used))
            goto bad;
        if (s->nprocs == s->procs_cap) {
            size_t cap = s->procs_cap ? s->procs_cap * 2 : 64;
            fake_proc *grown = realloc(s->procs, cap * sizeof *grown);
            if (!grown)
                goto bad;
            s->procs = grown;
            s->procs_cap = cap;
        }
        s->procs[s->nprocs++] = p;
        return 0;
    }
    if (strcmp(word, "error") == 0 || strcmp(word, "hang") == 0) {
        fake_fault *x;
        if (split(rest, f + 1, 4) != 3 || s->nfaults == FAKE_MAX_FAULTS)
            goto bad;
        x = &s->faults[s->nfaults];
        memset(x, 0, sizeof *x);
        copy_text(x->function, sizeof x->function, f[1]);
        if (parse_device(f[2], 1, &x->gpu, &x->mig))
            goto bad;
        if (word[0] == 'h') {
            char *end;
            x->is_hang = 1;
            x->seconds = strtod(f[3], &end);
            if (*end || !(x->seconds >= 0))
                goto bad;
        } else if (parse_int(f[3], 1, 1000000, &x->code)) {
            goto bad;
        }
        s->nfaults++;
        return 0;
    }
    if (split(rest, f + 1, 2) != 1)
        goto bad;
    if (strcmp(word, "driver_version") == 0) {
        copy_text(s->driver_version, sizeof s->driver_version, f[1]);
        return 0;
    }
    if (strcmp(word, "nvml_version") == 0) {
        copy_text(s->nvml_version, sizeof s->nvml_version, f[1]);
        return 0;
    }
    if (strcmp(word, "init_error") == 0 && !parse_int(f[1], 0, 1000000, &v)) {
        s->init_error = (nvmlReturn_t)v;
        return 0;
    }
    if (strcmp(word, "cuda_driver_version") == 0 && !parse_int(f[1], 0, 1000000, &v)) {
        s->cuda_driver_version = (int)v;
        return 0;
    }
    if (strcmp(word, "memory_v2") == 0 && !parse_flag(f[1], &s->memory_v2))
        return 0;
    if (strcmp(word, "r535_layout") == 0 && !parse_flag(f[1], &s->r535_layout))
        return 0;
    if (strcmp(word, "drop_dead_pids") == 0 && !parse_flag(f[1], &s->drop_dead_pids))
        return 0;
    if (strcmp(word, "memory_limits") == 0 && !parse_flag(f[1], &s->memory_limits))
        return 0;
    if (strcmp(word, "allocations") == 0 && !parse_flag(f[1], &s->allocations))
        return 0;
bad:
    snprintf(why, why_len, "cannot parse the '%s' line", word);
    return -1;
}

static fake_state *parse_file(const char *path, char *why, size_t why_len)
{
    FILE *fp = fopen(path, "r");
    fake_state *s;
    char line[1024];
    unsigned int i, lineno = 0;

    if (!fp) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return NULL;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        fclose(fp);
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    copy_text(s->driver_version, sizeof s->driver_version, "550.54.15");
    copy_text(s->nvml_version, sizeof s->nvml_version, "12.550.54.15");
    s->cuda_driver_version = 12040;
    s->memory_v2 = 1;
    while (fgets(line, sizeof line, fp)) {
        size_t len = strlen(line);
        char detail[200];
        lineno++;
        if (len && line[len - 1] != '\n' && !feof(fp)) {
            snprintf(why, why_len, "line %u is too long", lineno);
            goto fail;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        if (parse_line(s, line, detail, sizeof detail)) {
            snprintf(why, why_len, "line %u: %s", lineno, detail);
            goto fail;
        }
    }
    for (i = 0; i < s->gpu_count; i++) {
        if (!s->gpus[i].present) {
            snprintf(why, why_len, "GPU indexes must be 0..%u without gaps; %u is missing", s->gpu_count - 1, i);
            goto fail;
        }
    }
    fclose(fp);
    return s;
fail:
    fclose(fp);
    state_free(s);
    return NULL;
}

/* Brings g_state up to date with the file. Called with g_lock held, on every call. */
static void reload_locked(void)
{
    const char *path = g_env_path;
    struct stat st;
    char why[512];
    fake_state *fresh;

    if (!path || !*path || stat(path, &st) != 0) {
        state_free(g_state);
        g_state = NULL;
        g_state_error = NVML_ERROR_DRIVER_NOT_LOADED;
        g_have_stat = 0;
        return;
    }
    if (g_have_stat && strcmp(path, g_path) == 0 && st.st_dev == g_stat.st_dev && st.st_ino == g_stat.st_ino &&
        st.st_size == g_stat.st_size && st.st_mtim.tv_sec == g_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == g_stat.st_mtim.tv_nsec && st.st_ctim.tv_sec == g_stat.st_ctim.tv_sec &&
        st.st_ctim.tv_nsec == g_stat.st_ctim.tv_nsec)
        return;
    copy_text(g_path, sizeof g_path, path);
    g_stat = st;
    g_have_stat = 1;
    state_free(g_state);
    fresh = parse_file(path, why, sizeof why);
    g_state = fresh;
    if (!fresh) {
        g_state_error = NVML_ERROR_UNKNOWN;
        fprintf(stderr, "fake NVML: %s: %s\n", path, why);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The common prologue: state, hangs, injected errors */

static int fault_matches(const fake_fault *x, const char *function, int gpu, int mig)
{
    if (strcmp(x->function, "*") != 0 && strcmp(x->function, function) != 0)
        return 0;
    if (x->gpu == FAKE_ANY)
        return 1;
    if (gpu == FAKE_NO_DEVICE || x->gpu != gpu)
        return 0;
    return x->mig == -1 || x->mig == mig;
}

/* The hang a call should serve now, in seconds; 0 for none. */
static double hang_locked(const char *function, int gpu, int mig)
{
    int i;
    if (!g_state)
        return 0;
    for (i = 0; i < g_state->nfaults; i++) {
        const fake_fault *x = &g_state->faults[i];
        if (x->is_hang && fault_matches(x, function, gpu, mig))
            return x->seconds;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleeps without the lock, in short steps, so that other threads keep calling (a real hung ioctl blocks only
 * its caller) and a test that removes the hang releases the caller promptly. */
static void serve_hang(const char *function, int gpu, int mig, double seconds)
{
    double deadline = now_s() + seconds;
    struct timespec step = {0, 10 * 1000 * 1000};
    while (now_s() < deadline) {
        double still;
        nanosleep(&step, NULL);
        pthread_mutex_lock(&g_lock);
        reload_locked();
        still = hang_locked(function, gpu, mig);
        pthread_mutex_unlock(&g_lock);
        if (still <= 0)
            break;
    }
}

/* Every entry point but init starts here. On NVML_SUCCESS the lock is held and g_state is valid: the caller
 * answers from the state, then calls leave(). */
static nvmlReturn_t enter(const char *function, int gpu, int mig, int needs_init)
{
    double hang;
    int i;

    pthread_mutex_lock(&g_lock);
    reload_locked();
    hang = hang_locked(function, gpu, mig);
    if (hang > 0) {
        pthread_mutex_unlock(&g_lock);
        serve_hang(function, gpu, mig, hang);
        pthread_mutex_lock(&g_lock);
        reload_locked();
    }
    if (!g_state) {
        pthread_mutex_unlock(&g_lock);
        return g_state_error;
    }
    if (needs_init && g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    for (i = 0; i < g_state->nfaults; i++) {
        const fake_fault *x = &g_state->faults[i];
        if (!x->is_hang && fault_matches(x, function, gpu, mig)) {
            pthread_mutex_unlock(&g_lock);
            return (nvmlReturn_t)x->code;
        }
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&g_lock);
    return ret;
}

/* The (gpu, mig) slot a handle names, without looking at the state: -1 if it is not one of ours. */
static int handle_slot(nvmlDevice_t device, int *gpu, int *mig)
{
    const struct nvmlDevice_st *h = device;
    if (h >= &g_gpu_handles[0] && h < &g_gpu_handles[FAKE_MAX_GPUS]) {
        *gpu = (int)(h - &g_gpu_handles[0]);
        *mig = -1;
        return 0;
    }
    if (h >= &g_mig_handles[0][0] && h < &g_mig_handles[0][0] + FAKE_MAX_GPUS * FAKE_MAX_MIG) {
        ptrdiff_t at = h - &g_mig_handles[0][0];
        *gpu = (int)(at / FAKE_MAX_MIG);
        *mig = (int)(at % FAKE_MAX_MIG);
        return 0;
    }
    return -1;
}

/* enter() for a call on a device handle. A handle whose GPU or MIG instance left the state reports
 * NVML_ERROR_GPU_IS_LOST, as a GPU that fell off the bus does. */
static nvmlReturn_t enter_device(const char *function, nvmlDevice_t device, int *gpu, int *mig)
{
    nvmlReturn_t ret;
    if (handle_slot(device, gpu, mig))
        return NVML_ERROR_INVALID_ARGUMENT;
    ret = enter(function, *gpu, *mig, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if ((unsigned int)*gpu >= g_state->gpu_count || (*mig >= 0 && !g_state->gpus[*gpu].migs[*mig].present))
        return leave(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static const fake_memory *memory_of(int gpu, int mig)
{
    return mig < 0 ? &g_state->gpus[gpu].memory : &g_state->gpus[gpu].migs[mig].memory;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The driver's mutable state: memory limits per cgroup, and simulated allocations */

#define FAKE_MAX_RECORDS 4096
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

static int pid_is_dead(unsigned int pid);

typedef struct {
    int gpu;
    unsigned long long soft, hard;
    char path[PATH_MAX];
} fake_limit;

typedef struct {
    int gpu;
    unsigned int pid;
    unsigned long long bytes;
} fake_alloc;

/* "<state file>.<suffix>" (g_path is the state file; called with g_lock held). */
static void side_path(char *out, size_t cap, const char *suffix)
{
    snprintf(out, cap, "%s.%s", g_path, suffix);
}

/* Opens a side file locked (LOCK_SH or LOCK_EX), creating it for writers. -1 when it cannot. */
static int side_open(const char *suffix, int lock)
{
    char path[PATH_MAX + 16];
    int fd;
    side_path(path, sizeof path, suffix);
    fd = open(path, lock == LOCK_EX ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (flock(fd, lock) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static FILE *side_stream(int fd)
{
    int copy = dup(fd);
    FILE *fp = copy < 0 ? NULL : fdopen(copy, "r");
    if (!fp && copy >= 0)
        close(copy);
    return fp;
}

/* Reads up to `cap` limits from the locked file; returns how many. */
static size_t limits_read(int fd, fake_limit *out, size_t cap)
{
    char line[PATH_MAX + 128];
    size_t n = 0;
    FILE *fp;
    if (fd < 0 || lseek(fd, 0, SEEK_SET) < 0 || !(fp = side_stream(fd)))
        return 0;
    while (n < cap && fgets(line, sizeof line, fp)) {
        fake_limit *l = &out[n];
        int used = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%d %llu %llu %n", &l->gpu, &l->soft, &l->hard, &used) == 3 && used > 0)
            n++, copy_text(l->path, sizeof l->path, line + used);
    }
    fclose(fp);
    return n;
}

static size_t allocs_read(int fd, fake_alloc *out, size_t cap)
{
    char line[128];
    size_t n = 0;
    FILE *fp;
    if (fd < 0 || lseek(fd, 0, SEEK_SET) < 0 || !(fp = side_stream(fd)))
        return 0;
    while (n < cap && fgets(line, sizeof line, fp))
        if (sscanf(line, "%d %u %llu", &out[n].gpu, &out[n].pid, &out[n].bytes) == 3 && !pid_is_dead(out[n].pid))
            n++;
    fclose(fp);
    return n;
}

/* Where this process sees the cgroup v2 hierarchy mounted ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"). */
static int cgroup2_mount(char *out, size_t cap)
{
    char line[4096];
    int found = -1;
    FILE *fp = fopen("/proc/self/mountinfo", "r");
    if (!fp)
        return -1;
    while (found && fgets(line, sizeof line, fp)) {
        char mount_point[PATH_MAX], *sep = strstr(line, " - ");
        if (sep && strncmp(sep + 3, "cgroup2 ", 8) == 0 &&
            sscanf(line, "%*s %*s %*s %*s %4095s", mount_point) == 1) {
            copy_text(out, cap, mount_point);
            found = 0;
        }
    }
    fclose(fp);
    return found;
}

/* A limit's path relative to the v2 hierarchy ("/kubepods/..."), as /proc/<pid>/cgroup writes it. */
static int relative_cgroup(const char *path, char *out, size_t cap)
{
    char mount_point[PATH_MAX];
    size_t len;
    if (cgroup2_mount(mount_point, sizeof mount_point))
        return -1;
    len = strlen(mount_point);
    if (strncmp(path, mount_point, len) != 0 || (path[len] != '/' && path[len] != '\0'))
        return -1;
    copy_text(out, cap, path[len] ? path + len : "/");
    return 0;
}

/* The "0::" cgroup of a process ("/kubepods/besteffort/pod.../<id>"); -1 when gone. */
static int pid_cgroup2(unsigned int pid, char *out, size_t cap)
{
    char path[64], line[PATH_MAX];
    int found = -1;
    FILE *fp;
    snprintf(path, sizeof path, "/proc/%u/cgroup", pid);
    if (!(fp = fopen(path, "r")))
        return -1;
    while (found && fgets(line, sizeof line, fp)) {
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            copy_text(out, cap, line + 3);
            found = 0;
        }
    }
    fclose(fp);
    return found;
}

/* Whether cgroup `inner` is `outer` or below it (both relative to the v2 root). */
static int cgroup_within(const char *inner, const char *outer)
{
    size_t len = strlen(outer);
    if (strcmp(outer, "/") == 0)
        return 1;
    return strncmp(inner, outer, len) == 0 && (inner[len] == '\0' || inner[len] == '/');
}

static int pid_within(unsigned int pid, const char *relative)
{
    char cgroup[PATH_MAX];
    return pid_cgroup2(pid, cgroup, sizeof cgroup) == 0 && cgroup_within(cgroup, relative);
}

/* Live allocations (g_lock held; none unless the state asks for them). */
static size_t live_allocations(fake_alloc *out, size_t cap)
{
    size_t n;
    int fd;
    if (!g_state->allocations || (fd = side_open("alloc", LOCK_SH)) < 0)
        return 0;
    n = allocs_read(fd, out, cap);
    close(fd);
    return n;
}

/* Memory the processes of cgroup `relative` (and below) hold on whole GPU `gpu`: listed processes that are
 * alive plus live allocations. */
static unsigned long long cgroup_used(int gpu, const char *relative, const fake_alloc *allocs, size_t nallocs)
{
    unsigned long long used = 0;
    size_t i;
    for (i = 0; i < g_state->nprocs; i++) {
        const fake_proc *p = &g_state->procs[i];
        if (p->gpu == gpu && p->mig < 0 && p->used != (unsigned long long)NVML_VALUE_NOT_AVAILABLE &&
            !pid_is_dead(p->pid) && pid_within(p->pid, relative))
            used += p->used;
    }
    for (i = 0; i < nallocs; i++)
        if (allocs[i].gpu == gpu && pid_within(allocs[i].pid, relative))
            used += allocs[i].bytes;
    return used;
}

/* The hard limit on GPU `gpu` of the cgroup `pid` is in itself (its leaf, not a parent): 0 and *relative
 * untouched when that cgroup holds none. What nvmlDeviceGetMemoryInfo (cuMemGetInfo) reports follows this one:
 * NVIDIA documents truthful totals inside a container only where its own cgroup holds the limit. */
static unsigned long long leaf_limit(int gpu, unsigned int pid, char *relative, size_t cap)
{
    static fake_limit limits[FAKE_MAX_RECORDS]; /* g_lock held */
    char own[PATH_MAX], rel[PATH_MAX];
    size_t i, n;
    int fd;
    if (!g_state->memory_limits || pid_cgroup2(pid, own, sizeof own) != 0 || (fd = side_open("limits", LOCK_SH)) < 0)
        return 0;
    n = limits_read(fd, limits, FAKE_MAX_RECORDS);
    close(fd);
    for (i = 0; i < n; i++)
        if (limits[i].gpu == gpu && relative_cgroup(limits[i].path, rel, sizeof rel) == 0 && strcmp(rel, own) == 0) {
            copy_text(relative, cap, rel);
            return limits[i].hard;
        }
    return 0;
}

/* Whether `bytes` more for `pid` on GPU `gpu` would take any limited cgroup it is in (its own or any parent:
 * a pod's limit bounds every container below it) over its hard limit. */
static int over_a_limit(int gpu, unsigned int pid, unsigned long long bytes, const fake_alloc *allocs, size_t nallocs)
{
    static fake_limit limits[FAKE_MAX_RECORDS]; /* g_lock held */
    char rel[PATH_MAX];
    size_t i, n;
    int fd;
    if (!g_state->memory_limits || (fd = side_open("limits", LOCK_SH)) < 0)
        return 0;
    n = limits_read(fd, limits, FAKE_MAX_RECORDS);
    close(fd);
    for (i = 0; i < n; i++)
        if (limits[i].gpu == gpu && relative_cgroup(limits[i].path, rel, sizeof rel) == 0 && pid_within(pid, rel) &&
            cgroup_used(gpu, rel, allocs, nallocs) + bytes > limits[i].hard)
            return 1;
    return 0;
}

/* The memory a caller sees: the state's figures plus live allocations; inside a limited cgroup, the limit as
 * the total and the cgroup's own usage as used (g_lock held). */
static fake_memory effective_memory(int gpu, int mig)
{
    static fake_alloc allocs[FAKE_MAX_RECORDS];
    fake_memory m = *memory_of(gpu, mig);
    size_t i, n;
    char relative[PATH_MAX];
    unsigned long long hard;
    if (mig >= 0)
        return m;
    n = live_allocations(allocs, FAKE_MAX_RECORDS);
    for (i = 0; i < n; i++)
        if (allocs[i].gpu == gpu)
            m.used += allocs[i].bytes, m.free = m.free > allocs[i].bytes ? m.free - allocs[i].bytes : 0;
    hard = leaf_limit(gpu, (unsigned int)getpid(), relative, sizeof relative);
    if (hard && hard < m.total) {
        unsigned long long used = cgroup_used(gpu, relative, allocs, n);
        m.total = hard;
        m.reserved = 0;
        m.used = used;
        m.free = used < hard ? hard - used : 0;
    }
    return m;
}

/* Test-only entry point: the calling process allocates `bytes` on GPU `index`, as cudaMalloc would. Fails with
 * NVML_ERROR_MEMORY (CUDA_ERROR_OUT_OF_MEMORY) when the GPU has not that much free, or when it would take a
 * cgroup the caller is in over its hard limit; the memory stays allocated until the process exits. */
FAKE_EXPORT nvmlReturn_t vgFakeAllocate(unsigned int index, unsigned long long bytes)
{
    static fake_alloc allocs[FAKE_MAX_RECORDS];
    char line[96];
    unsigned long long free_bytes;
    size_t i, n;
    int fd;
    nvmlReturn_t ret = enter("vgFakeAllocate", (int)index, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (index >= g_state->gpu_count || !g_state->allocations)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    free_bytes = g_state->gpus[index].memory.free;
    n = live_allocations(allocs, FAKE_MAX_RECORDS);
    for (i = 0; i < n; i++)
        if (allocs[i].gpu == (int)index)
            free_bytes = free_bytes > allocs[i].bytes ? free_bytes - allocs[i].bytes : 0;
    if (bytes > free_bytes || over_a_limit((int)index, (unsigned int)getpid(), bytes, allocs, n))
        return leave(NVML_ERROR_MEMORY);
    if ((fd = side_open("alloc", LOCK_EX)) < 0)
        return leave(NVML_ERROR_UNKNOWN);
    snprintf(line, sizeof line, "%u %d %llu\n", index, (int)getpid(), bytes);
    ret = (lseek(fd, 0, SEEK_END) >= 0 && write(fd, line, strlen(line)) == (ssize_t)strlen(line))
              ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    close(fd);
    return leave(ret);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Init, shutdown, errors, system */

static nvmlReturn_t do_init(const char *function)
{
    nvmlReturn_t ret;
    /* The environment is read here only: getenv() racing a setenv() in another thread (a test's next
     * monkeypatch while an abandoned call still polls its hang) may read freed memory. */
    const char *env = getenv("VRAMGUARD_FAKE_NVML_STATE");
    pthread_mutex_lock(&g_lock);
    copy_text(g_env_path, sizeof g_env_path, env);
    pthread_mutex_unlock(&g_lock);
    ret = enter(function, FAKE_NO_DEVICE, -1, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (g_state->init_error != NVML_SUCCESS)
        return leave(g_state->init_error);
    g_init_count++;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }
FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
FAKE_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

FAKE_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = enter("nvmlShutdown", FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    g_init_count--;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Fake NVML error";
    }
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter("nvmlSystemGetDriverVersion", FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(version, length, g_state->driver_version));
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter("nvmlSystemGetNVMLVersion", FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(version, length, g_state->nvml_version));
}

static nvmlReturn_t cuda_driver_version(const char *function, int *out)
{
    nvmlReturn_t ret = enter(function, FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = g_state->cuda_driver_version;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    return cuda_driver_version("nvmlSystemGetCudaDriverVersion", v);
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return cuda_driver_version("nvmlSystemGetCudaDriverVersion_v2", v);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Devices */

static nvmlReturn_t device_count(const char *function, unsigned int *count)
{
    nvmlReturn_t ret = enter(function, FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = g_state->gpu_count;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return device_count("nvmlDeviceGetCount", c); }
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return device_count("nvmlDeviceGetCount_v2", c); }

static nvmlReturn_t handle_by_index(const char *function, unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter(function, index < FAKE_MAX_GPUS ? (int)index : FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!device || index >= g_state->gpu_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    g_gpu_handles[index].gpu = (int)index;
    g_gpu_handles[index].mig = -1;
    *device = &g_gpu_handles[index];
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index("nvmlDeviceGetHandleByIndex", index, device);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned int i;
    int m;
    nvmlReturn_t ret = enter("nvmlDeviceGetHandleByUUID", FAKE_NO_DEVICE, -1, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_state->gpu_count; i++) {
        const fake_gpu *g = &g_state->gpus[i];
        if (strcmp(g->uuid, uuid) == 0) {
            *device = &g_gpu_handles[i];
            return leave(NVML_SUCCESS);
        }
        for (m = 0; m < FAKE_MAX_MIG; m++) {
            if (g->migs[m].present && strcmp(g->migs[m].uuid, uuid) == 0) {
                *device = &g_mig_handles[i][m];
                return leave(NVML_SUCCESS);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetUUID", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(uuid, length, mig < 0 ? g_state->gpus[gpu].uuid : g_state->gpus[gpu].migs[mig].uuid));
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetName", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    return leave(copy_out(name, length, mig < 0 ? g_state->gpus[gpu].name : g_state->gpus[gpu].migs[mig].name));
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetIndex", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)gpu;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int gpu, mig;
    const fake_memory *m;
    fake_memory em;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMemoryInfo", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    em = effective_memory(gpu, mig);
    m = &em;
    /* v1 counts the driver's reservation as used, which is why callers prefer v2 */
    memory->total = m->total;
    memory->free = m->free;
    memory->used = m->used + m->reserved;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int gpu, mig;
    const fake_memory *m;
    fake_memory em;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMemoryInfo_v2", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!g_state->memory_v2)
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    em = effective_memory(gpu, mig);
    m = &em;
    memory->total = m->total;
    memory->reserved = m->reserved;
    memory->free = m->free;
    memory->used = m->used;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Processes */

/* Gone, or a zombie: the driver has released its memory. */
static int pid_is_dead(unsigned int pid)
{
    char path[64], buf[512], *close_paren;
    ssize_t n;
    FILE *fp;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    fp = fopen(path, "r");
    if (!fp)
        return 1;
    n = (ssize_t)fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    if (n <= 0)
        return 1;
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    return !close_paren || close_paren[1] != ' ' || close_paren[2] == 'Z' || close_paren[2] == 'X';
}

/* R535.43-535.86 filled _v3 arrays with this struct (the later nvmlProcessDetail_v1_t has the same layout)
 * while the header still declared the 24-byte nvmlProcessInfo_t. */
typedef nvmlProcessDetail_v1_t fake_r535_process_info;

/* Whether a listed process shows in a (gpu, mig, kind) list now. */
static int proc_listed(const fake_proc *p, int gpu, int mig, enum fake_kind kind)
{
    return p->gpu == gpu && p->mig == mig && p->kind == kind && !(g_state->drop_dead_pids && pid_is_dead(p->pid));
}

/* Whether allocation `i` starts a row of its own: no listed process and no earlier allocation has its PID. */
static int alloc_is_new_row(const fake_alloc *allocs, size_t i, int gpu, int mig, enum fake_kind kind)
{
    size_t j;
    for (j = 0; j < g_state->nprocs; j++)
        if (g_state->procs[j].pid == allocs[i].pid && proc_listed(&g_state->procs[j], gpu, mig, kind))
            return 0;
    for (j = 0; j < i; j++)
        if (allocs[j].gpu == gpu && allocs[j].pid == allocs[i].pid)
            return 0;
    return 1;
}

static nvmlReturn_t running_processes(const char *function, enum fake_kind kind, size_t stride_v, nvmlDevice_t device,
                                      unsigned int *info_count, void *infos)
{
    static fake_alloc allocs[FAKE_MAX_RECORDS]; /* g_lock held */
    int gpu, mig;
    size_t i, j, n = 0, nallocs, stride = stride_v;
    unsigned char *out = infos;
    nvmlReturn_t ret = enter_device(function, device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!info_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (stride == 0) /* the _v3 functions: the trap, when the state asks for it */
        stride = g_state->r535_layout ? sizeof(fake_r535_process_info) : sizeof(nvmlProcessInfo_t);

    /* Allocations are compute memory on whole GPUs: they add to a listed process's row, or make their own. */
    nallocs = (mig < 0 && kind == KIND_COMPUTE) ? live_allocations(allocs, FAKE_MAX_RECORDS) : 0;
    for (i = 0; i < g_state->nprocs; i++)
        if (proc_listed(&g_state->procs[i], gpu, mig, kind))
            n++;
    for (i = 0; i < nallocs; i++)
        if (allocs[i].gpu == gpu && alloc_is_new_row(allocs, i, gpu, mig, kind))
            n++;
    if (n == 0) {
        *info_count = 0;
        return leave(NVML_SUCCESS);
    }
    if (*info_count < n || !infos) {
        *info_count = (unsigned int)n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    n = 0;
    for (i = 0; i < g_state->nprocs + nallocs; i++) {
        fake_r535_process_info row;
        unsigned long long used;
        unsigned int pid;
        if (i < g_state->nprocs) {
            const fake_proc *p = &g_state->procs[i];
            if (!proc_listed(p, gpu, mig, kind))
                continue;
            pid = p->pid;
            used = p->used;
        } else {
            const fake_alloc *a = &allocs[i - g_state->nprocs];
            if (a->gpu != gpu || !alloc_is_new_row(allocs, i - g_state->nprocs, gpu, mig, kind))
                continue;
            pid = a->pid;
            used = 0;
        }
        if (used != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
            for (j = 0; j < nallocs; j++)
                if (allocs[j].gpu == gpu && allocs[j].pid == pid)
                    used += allocs[j].bytes;
        /* Build the widest row, then copy the prefix the stride asks for: v1, v2 and the R535 row share it. */
        memset(&row, 0, sizeof row);
        row.pid = pid;
        row.usedGpuMemory = used;
        row.gpuInstanceId = mig < 0 ? 0xFFFFFFFFu : g_state->gpus[gpu].migs[mig].gi;
        row.computeInstanceId = mig < 0 ? 0xFFFFFFFFu : g_state->gpus[gpu].migs[mig].ci;
        memcpy(out + n * stride, &row, stride);
        n++;
    }
    *info_count = (unsigned int)n;
    return leave(NVML_SUCCESS);
}

#define FAKE_PROCESS_FUNCTIONS(Name, kind)                                                                         \
    FAKE_EXPORT nvmlReturn_t nvmlDeviceGet##Name##RunningProcesses(nvmlDevice_t device, unsigned int *count,         \
                                                                   nvmlProcessInfo_v1_t *infos)                  \
    {                                                                                                              \
        return running_processes("nvmlDeviceGet" #Name "RunningProcesses", kind, sizeof *infos, device, count,     \
                                 infos);                                                                           \
    }                                                                                                              \
    FAKE_EXPORT nvmlReturn_t nvmlDeviceGet##Name##RunningProcesses_v2(nvmlDevice_t device, unsigned int *count,      \
                                                                      nvmlProcessInfo_v2_t *infos)               \
    {                                                                                                              \
        return running_processes("nvmlDeviceGet" #Name "RunningProcesses_v2", kind, sizeof *infos, device, count,  \
                                 infos);                                                                           \
    }                                                                                                              \
    FAKE_EXPORT nvmlReturn_t nvmlDeviceGet##Name##RunningProcesses_v3(nvmlDevice_t device, unsigned int *count,      \
                                                                      nvmlProcessInfo_t *infos)                  \
    {                                                                                                              \
        return running_processes("nvmlDeviceGet" #Name "RunningProcesses_v3", kind, 0, device, count, infos);      \
    }

FAKE_PROCESS_FUNCTIONS(Compute, KIND_COMPUTE)
FAKE_PROCESS_FUNCTIONS(Graphics, KIND_GRAPHICS)
FAKE_PROCESS_FUNCTIONS(MPSCompute, KIND_MPS)

/* ---------------------------------------------------------------------------------------------------------- */
/* MIG */

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    int gpu, mig;
    const fake_gpu *g;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMigMode", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    g = &g_state->gpus[gpu];
    if (mig >= 0 || !current || !pending)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = g->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMaxMigDeviceCount", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (mig >= 0 || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g_state->gpus[gpu].mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *count = FAKE_MAX_MIG;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                            nvmlDevice_t *mig_device)
{
    int gpu, mig;
    const fake_gpu *g;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMigDeviceHandleByIndex", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    g = &g_state->gpus[gpu];
    if (mig >= 0 || !mig_device || index >= FAKE_MAX_MIG)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!g->mig_enabled || !g->migs[index].present)
        return leave(NVML_ERROR_NOT_FOUND);
    g_mig_handles[gpu][index].gpu = gpu;
    g_mig_handles[gpu][index].mig = (int)index;
    *mig_device = &g_mig_handles[gpu][index];
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceIsMigDeviceHandle", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!is_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = mig >= 0;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig_device, nvmlDevice_t *device)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig_device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (mig < 0 || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_gpu_handles[gpu];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(const char *function, nvmlDevice_t device, unsigned int *id, int compute)
{
    int gpu, mig;
    nvmlReturn_t ret = enter_device(function, device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if (mig < 0 || !id)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *id = compute ? g_state->gpus[gpu].migs[mig].ci : g_state->gpus[gpu].migs[mig].gi;
    return leave(NVML_SUCCESS);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id("nvmlDeviceGetGpuInstanceId", device, id, 0);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id("nvmlDeviceGetComputeInstanceId", device, id, 1);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Memory limits per cgroup (R615+). A build with -DFAKE_NO_MEMORY_LIMITS stands for an older driver: the
 * symbols are absent and pynvml reports NVML_ERROR_FUNCTION_NOT_FOUND. */

#ifndef FAKE_NO_MEMORY_LIMITS

static void log_limit_call(const char *verb, int gpu, unsigned long long soft, unsigned long long hard,
                           nvmlReturn_t ret, const char *path)
{
    char line[PATH_MAX + 160];
    struct timespec now;
    int fd = side_open("calls", LOCK_EX);
    if (fd < 0)
        return;
    /* CLOCK_BOOTTIME: the clock of /proc/<pid>/stat's start times, so a call can be placed against a process start */
    clock_gettime(CLOCK_BOOTTIME, &now);
    snprintf(line, sizeof line, "%s %d %llu %llu %d %lld.%09ld %s\n", verb, gpu, soft, hard, (int)ret,
             (long long)now.tv_sec, now.tv_nsec, path ? path : "-");
    if (lseek(fd, 0, SEEK_END) >= 0 && write(fd, line, strlen(line)) < 0)
        fprintf(stderr, "fake NVML: cannot log a limits call: %s\n", strerror(errno));
    close(fd);
}

/* What both calls check first, with g_lock held: NVML_SUCCESS or the error nvml.h documents. */
static nvmlReturn_t limits_prologue(const void *limits, int gpu, int mig, const char *path)
{
    struct statfs fs;
    int fd;
    if (!limits || !path)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mig >= 0 || !g_state->memory_limits) /* "MIG handles are not supported" */
        return NVML_ERROR_NOT_SUPPORTED;
    (void)gpu;
    /* "NVML_ERROR_OPERATING_SYSTEM if the cgroup path cannot be opened": a directory of the v2 hierarchy. */
    fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    if (fstatfs(fd, &fs) != 0 || fs.f_type != CGROUP2_SUPER_MAGIC) {
        close(fd);
        return NVML_ERROR_OPERATING_SYSTEM;
    }
    close(fd);
    return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits)
{
    static fake_limit all[FAKE_MAX_RECORDS]; /* g_lock held */
    const char *path = limits ? limits->nameSpace : NULL;
    unsigned long long soft = limits ? limits->softLimit : 0, hard = limits ? limits->hardLimit : 0, total;
    int gpu, mig, fd, clear;
    size_t i, n, kept = 0;
    FILE *fp;
    nvmlReturn_t ret = enter_device("nvmlDeviceSetMemoryLimits_v1", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if ((ret = limits_prologue(limits, gpu, mig, path)) != NVML_SUCCESS)
        goto out;
    if (geteuid() != 0) { /* "Requires root/admin permissions" */
        ret = NVML_ERROR_NO_PERMISSION;
        goto out;
    }
    total = g_state->gpus[gpu].memory.total;
    clear = soft == 0 && hard == NVML_DEVICE_MEMORY_LIMIT_MAX;
    /* "the softLimit exceeds the hardLimit, or a limit exceeds total device memory" */
    if (!clear && (soft > hard || soft > total || hard > total)) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if ((fd = side_open("limits", LOCK_EX)) < 0) {
        ret = NVML_ERROR_UNKNOWN;
        goto out;
    }
    n = limits_read(fd, all, FAKE_MAX_RECORDS);
    for (i = 0; i < n; i++)
        if (!(all[i].gpu == gpu && strcmp(all[i].path, path) == 0))
            all[kept++] = all[i];
    if (!clear && kept < FAKE_MAX_RECORDS) {
        all[kept].gpu = gpu;
        all[kept].soft = soft;
        all[kept].hard = hard;
        copy_text(all[kept].path, sizeof all[kept].path, path);
        kept++;
    }
    ret = NVML_ERROR_UNKNOWN;
    if (ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0) {
        int copy = dup(fd);
        if (copy >= 0 && (fp = fdopen(copy, "w")) != NULL) {
            for (i = 0; i < kept; i++)
                fprintf(fp, "%d %llu %llu %s\n", all[i].gpu, all[i].soft, all[i].hard, all[i].path);
            ret = fclose(fp) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
        } else if (copy >= 0) {
            close(copy);
        }
    }
    close(fd);
out:
    log_limit_call("set", gpu, soft, hard, ret, path);
    return leave(ret);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, nvmlGetMemoryLimits_v1_t *limits)
{
    static fake_limit all[FAKE_MAX_RECORDS];
    static fake_alloc allocs[FAKE_MAX_RECORDS];
    const char *path = limits ? limits->nameSpace : NULL;
    int gpu, mig, fd;
    size_t i, n;
    nvmlReturn_t ret = enter_device("nvmlDeviceGetMemoryLimits_v1", device, &gpu, &mig);
    if (ret != NVML_SUCCESS)
        return ret;
    if ((ret = limits_prologue(limits, gpu, mig, path)) != NVML_SUCCESS)
        goto out;
    ret = NVML_ERROR_NOT_FOUND; /* "if the limits were not found for this device and cgroup" */
    if ((fd = side_open("limits", LOCK_SH)) >= 0) {
        n = limits_read(fd, all, FAKE_MAX_RECORDS);
        close(fd);
        for (i = 0; i < n; i++) {
            char relative[PATH_MAX];
            if (all[i].gpu != gpu || strcmp(all[i].path, path) != 0)
                continue;
            limits->softLimit = all[i].soft;
            limits->hardLimit = all[i].hard;
            limits->currentUsed = relative_cgroup(path, relative, sizeof relative) == 0
                ? cgroup_used(gpu, relative, allocs, live_allocations(allocs, FAKE_MAX_RECORDS)) : 0;
            ret = NVML_SUCCESS;
            break;
        }
    }
out:
    log_limit_call("get", gpu, limits && ret == NVML_SUCCESS ? limits->softLimit : 0,
                   limits && ret == NVML_SUCCESS ? limits->hardLimit : 0, ret, path);
    return leave(ret);
}

#endif /* FAKE_NO_MEMORY_LIMITS */
