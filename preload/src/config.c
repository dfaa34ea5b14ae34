/* Configuration from the environment and logging.
 * Invalid values never leave a process uncapped: each falls back to the strictest safe reading. */
#include "tessera.h"
#include "logline.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

struct tessera_config g_cfg = {.mem_limit = TESSERA_NO_LIMIT, .request = 1.0, .limit = 1.0,
                               .log_level = TLOG_WARN};

#define MIN_SHARE 0.01

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void tlog(int level, const char *fmt, ...) {
    if (level > g_cfg.log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    logline_write(1024, "tessera-preload", names[level], fmt, ap);
    va_end(ap);
}

int parse_bytes(const char *text, uint64_t *out) {
    if (!text || !*text) return -1;
    errno = 0;
    char *end = NULL;
    if (*text == '-' || *text == '+') return -1;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text) return -1;
    unsigned shift = 0;
    if (*end) {
        switch (*end) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        case 'T': case 't': shift = 40; break;
        default: return -1;
        }
        end++;
        if (*end == 'i' || *end == 'B') end++;
        if (*end == 'B' && end[-1] == 'i') end++;
        if (*end) return -1;
    }
    if (shift && value > (UINT64_MAX >> shift)) return -1;
    *out = (uint64_t)value << shift;
    return 0;
}

/* A share in (0, 1]; -1 when absent, -2 when invalid. */
static double parse_share(const char *name) {
    const char *text = getenv(name);
    if (!text) return -1;
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v <= 0 || v > 1) {
        tlog(TLOG_ERROR, "%s=\"%s\" is not a share in (0, 1]", name, text);
        return -2;
    }
    return v;
}

static void copy_env(char *dst, size_t cap, const char *name, const char *fallback) {
    const char *v = getenv(name);
    if (!v || !*v) v = fallback;
    if (strlen(v) >= cap) {
        tlog(TLOG_ERROR, "%s is longer than %zu characters; using \"%s\"", name, cap - 1, fallback);
        v = fallback;
    }
    snprintf(dst, cap, "%s", v);
}

static int valid_id(const char *s) {
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '.' || *s == ':'))
            return 0;
    return 1;
}

void config_load(void) {
    const char *lvl = getenv("TESSERA_LOG_LEVEL");
    if (lvl) {
        static const char *names[] = {"error", "warn", "info", "debug"};
        int found = -1;
        for (int i = 0; i < 4; i++)
            if (!strcasecmp(lvl, names[i]) || (lvl[0] == '0' + i && !lvl[1])) found = i;
        if (found < 0) tlog(TLOG_ERROR, "TESSERA_LOG_LEVEL=\"%s\" is not error|warn|info|debug", lvl);
        else g_cfg.log_level = found;
    }

    const char *mem = getenv("TESSERA_GPU_MEMORY_LIMIT");
    if (mem) {
        uint64_t v;
        if (parse_bytes(mem, &v)) {
            tlog(TLOG_ERROR, "TESSERA_GPU_MEMORY_LIMIT=\"%s\" is not a size (bytes, or Ki/Mi/Gi suffix); "
                 "no GPU memory will be allocated", mem);
            v = 0;
        }
        g_cfg.mem_limit = v;
    }

    double req = parse_share("TESSERA_GPU_REQUEST"), lim = parse_share("TESSERA_GPU_LIMIT");
    g_cfg.compute_enabled = req != -1 || lim != -1;
    if (g_cfg.compute_enabled) {
        if (lim == -2) lim = req > 0 ? req : MIN_SHARE;             /* strictest: no burst above request */
        if (req == -2) req = MIN_SHARE;                             /* strictest guarantee */
        if (req == -1) req = lim;
        if (lim == -1) lim = req;
        if (req > lim) {
            tlog(TLOG_ERROR, "TESSERA_GPU_REQUEST %.3f exceeds TESSERA_GPU_LIMIT %.3f; using %.3f for both",
                 req, lim, lim);
            req = lim;
        }
        g_cfg.request = req;
        g_cfg.limit = lim;
    }

    const char *prio = getenv("TESSERA_PRIORITY");
    if (prio && !strcasecmp(prio, "high")) g_cfg.priority_high = 1;
    else if (prio && strcasecmp(prio, "low") && strcasecmp(prio, "normal") && *prio)
        tlog(TLOG_ERROR, "TESSERA_PRIORITY=\"%s\" is not high|normal|low; using low", prio);

    copy_env(g_cfg.broker_socket, sizeof g_cfg.broker_socket, "TESSERA_BROKER_SOCKET",
             "/run/tessera/broker.sock");
    copy_env(g_cfg.share_id, sizeof g_cfg.share_id, "TESSERA_SHARE_ID", "default");
    if (!valid_id(g_cfg.share_id)) {
        tlog(TLOG_ERROR, "TESSERA_SHARE_ID may hold only letters, digits and -_.:; using \"invalid\"");
        snprintf(g_cfg.share_id, sizeof g_cfg.share_id, "invalid");
    }
    const char *gpu = getenv("TESSERA_GPU_UUID");
    if (!gpu || !*gpu) gpu = getenv("NVIDIA_VISIBLE_DEVICES");
    snprintf(g_cfg.gpu, sizeof g_cfg.gpu, "%s", gpu && *gpu ? gpu : "0");
    char *comma = strchr(g_cfg.gpu, ',');
    if (comma) *comma = 0;   /* the share is enforced on the first visible GPU */
    if (!valid_id(g_cfg.gpu)) snprintf(g_cfg.gpu, sizeof g_cfg.gpu, "0");

    char fallback[256];
    snprintf(fallback, sizeof fallback, "/dev/shm/tessera-budget-%s", g_cfg.share_id);
    copy_env(g_cfg.budget_path, sizeof g_cfg.budget_path, "TESSERA_BUDGET_PATH", fallback);

    if (g_cfg.mem_limit != TESSERA_NO_LIMIT)
        tlog(TLOG_INFO, "memory cap %llu bytes, budget %s", (unsigned long long)g_cfg.mem_limit,
             g_cfg.budget_path);
    if (g_cfg.compute_enabled)
        tlog(TLOG_INFO, "compute share request %.3f limit %.3f priority %s broker %s", g_cfg.request,
             g_cfg.limit, g_cfg.priority_high ? "high" : "low", g_cfg.broker_socket);
}
