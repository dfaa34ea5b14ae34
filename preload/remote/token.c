/* Share tokens: what the portal issues with a remote placement and the GPU node's server checks
 * before it runs anything for a client.
 *
 *   tsr1.<claims, base64url>.<HMAC-SHA256(node secret, "tsr1." + claims in base64url), base64url>
 *   claims: "v=2 share=<id> attempt=<n> gpu=<uuid> mem=<bytes> request=<f> limit=<f>
 *            priority=<high|normal|low> exp=<unix s>"
 *
 * The claims are the share's terms: the server runs the client's calls under exactly these (memory
 * cap, compute request and limit), so a client cannot pick its own. `attempt` is the placement the
 * token was issued for (1, 2, ... as the share is placed again): a revocation voids a share's tokens
 * of the attempts before a given one (server.c). Version 1 (without it) is refused. Issued by
 * wire/share_tokens.py. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *why, size_t why_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return -1;
}

static int b64url_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

/* Unpadded base64url; -1 on a bad character or length, else the decoded length. */
static long b64url_decode(const char *in, size_t len, uint8_t *out, size_t cap) {
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    if (len % 4 == 1) return -1;
    for (size_t i = 0; i < len; i++) {
        int v = b64url_value(in[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap) return -1;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)o;
}

int token_valid_id(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 128) return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == ':' || *s == '-'))
            return 0;
    return 1;
}

static int parse_share(const char *v, double *out) {
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || *end || !isfinite(d) || d <= 0 || d > 1) return -1;
    *out = d;
    return 0;
}

static int parse_u64(const char *v, uint64_t *out) {
    char *end;
    if (*v < '0' || *v > '9') return -1;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || *end) return -1;
    *out = n;
    return 0;
}

int token_verify(const char *token, const void *secret, size_t secret_len, int64_t now, struct share_token *out,
                 char *why, size_t why_len) {
    size_t len = strnlen(token, WIRE_MAX_TOKEN + 1);
    if (len > WIRE_MAX_TOKEN) return fail(why, why_len, "token longer than %u bytes", WIRE_MAX_TOKEN);
    if (strncmp(token, "tsr1.", 5) != 0) return fail(why, why_len, "not a Tessera share token (tsr1.…)");
    const char *claims = token + 5, *dot = strchr(claims, '.');
    if (!dot) return fail(why, why_len, "token has no signature");
    const char *sig = dot + 1;
    uint8_t mac[32], want[32];
    if (b64url_decode(sig, strlen(sig), mac, sizeof mac) != 32) return fail(why, why_len, "token signature is malformed");
    hmac_sha256(secret, secret_len, token, (size_t)(dot - token), want);
    uint8_t diff = 0;
    for (int i = 0; i < 32; i++) diff |= (uint8_t)(mac[i] ^ want[i]);
    if (diff) return fail(why, why_len, "token signature does not match this node's secret");

    char text[1024];
    long n = b64url_decode(claims, (size_t)(dot - claims), (uint8_t *)text, sizeof text - 1);
    if (n < 0) return fail(why, why_len, "token claims are malformed");
    text[n] = 0;
    memset(out, 0, sizeof *out);
    int seen = 0;
    enum { V = 1, SHARE = 2, GPU = 4, MEM = 8, REQ = 16, LIM = 32, PRIO = 64, EXP = 128, ATTEMPT = 256, ALL = 511 };
    char *save = NULL;
    for (char *field = strtok_r(text, " ", &save); field; field = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(field, '=');
        if (!eq) return fail(why, why_len, "token claim \"%.40s\" is not key=value", field);
        *eq = 0;
        const char *k = field, *v = eq + 1;
        int bit;
        if (!strcmp(k, "v")) {
            bit = V;
            if (strcmp(v, "2")) return fail(why, why_len, "token version %.8s is not supported (this server speaks 2)", v);
        } else if (!strcmp(k, "share")) {
            bit = SHARE;
            if (!token_valid_id(v)) return fail(why, why_len, "token share id is not 1-128 of A-Za-z0-9._:-");
            snprintf(out->share, sizeof out->share, "%s", v);
        } else if (!strcmp(k, "attempt")) {
            bit = ATTEMPT;
            uint64_t a;
            if (parse_u64(v, &a) || a < 1 || a >= UINT32_MAX)
                return fail(why, why_len, "token attempt is not in 1-%u", UINT32_MAX - 1);
            out->attempt = (uint32_t)a;
        } else if (!strcmp(k, "gpu")) {
            bit = GPU;
            if (!token_valid_id(v)) return fail(why, why_len, "token gpu is not 1-128 of A-Za-z0-9._:-");
            snprintf(out->gpu, sizeof out->gpu, "%s", v);
        } else if (!strcmp(k, "mem")) {
            bit = MEM;
            if (parse_u64(v, &out->mem)) return fail(why, why_len, "token mem is not a byte count");
        } else if (!strcmp(k, "request")) {
            bit = REQ;
            if (parse_share(v, &out->request)) return fail(why, why_len, "token request is not in (0, 1]");
        } else if (!strcmp(k, "limit")) {
            bit = LIM;
            if (parse_share(v, &out->limit)) return fail(why, why_len, "token limit is not in (0, 1]");
        } else if (!strcmp(k, "priority")) {
            bit = PRIO;
            if (strcmp(v, "high") && strcmp(v, "normal") && strcmp(v, "low"))
                return fail(why, why_len, "token priority is not high, normal or low");
            snprintf(out->priority, sizeof out->priority, "%s", v);
        } else if (!strcmp(k, "exp")) {
            bit = EXP;
            uint64_t e;
            if (parse_u64(v, &e) || e > (uint64_t)INT64_MAX) return fail(why, why_len, "token exp is not a time");
            out->expires = (int64_t)e;
        } else {
            return fail(why, why_len, "token has an unknown claim \"%.40s\"", k);
        }
        if (seen & bit) return fail(why, why_len, "token repeats the claim \"%s\"", k);
        seen |= bit;
    }
    if (seen != ALL)
        return fail(why, why_len, "token lacks a claim (needs v share attempt gpu mem request limit priority exp)");
    if (out->request > out->limit) return fail(why, why_len, "token request is above its limit");
    if (out->expires <= now) return fail(why, why_len, "token expired");
    return 0;
}
