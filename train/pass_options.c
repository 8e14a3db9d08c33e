/* pass_options.c — compile.passes and compile.schedule read from the
 * command line and from the config file.
 *
 * One list of passes is names in order, each optionally with its own
 * budget in MiB: "prefetch,selective_gather@512" on the command line,
 * ["prefetch", ["selective_gather", 512]] in the file; "none" or [] for no
 * pass. A schedule is steps each with such a list: "5:prefetch;10:none",
 * or [[5, ["prefetch"]], [10, []]] in the file. Every name must be a
 * registered pass, budgets are 1 .. 2^30 MiB, steps > 0 and ascending. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

#define BUDGET_MAX_MB (INT64_C(1) << 30)

static int add_pass(regc_pass_list *l, const char *name, size_t len, int64_t mb, char *why,
                    size_t cap)
{
    char n[REGC_PASS_NAME];
    if (len == 0 || len >= sizeof n) {
        snprintf(why, cap, "a pass name of 1 to %d bytes", REGC_PASS_NAME - 1);
        return -1;
    }
    memcpy(n, name, len);
    n[len] = '\0';
    if (!regc_pass_known(n)) {
        snprintf(why, cap,
                 "no pass named \"%s\" (built in: prefetch, overlap_reduce, "
                 "selective_gather)",
                 n);
        return -1;
    }
    if (mb < 0 || mb > BUDGET_MAX_MB) {
        snprintf(why, cap, "%s: a budget from 1 to %lld MiB", n, (long long)BUDGET_MAX_MB);
        return -1;
    }
    if (l->n == REGC_MAX_PASSES) {
        snprintf(why, cap, "at most %d passes", REGC_MAX_PASSES);
        return -1;
    }
    snprintf(l->pass[l->n].name, REGC_PASS_NAME, "%s", n);
    l->pass[l->n++].budget_bytes = mb << 20;
    return 0;
}

int regc_passes_from_text(const char *text, regc_pass_list *l, char *why, size_t cap)
{
    memset(l, 0, sizeof *l);
    if (!strcmp(text, "none"))
        return 0;
    for (const char *p = text;;) {
        size_t len = strcspn(p, ",@");
        int64_t mb = 0;
        const char *next = p + len;
        if (*next == '@') {
            char *end = (char *)next + 1;
            long long v = next[1] >= '0' && next[1] <= '9' ? strtoll(next + 1, &end, 10) : 0;
            if (end == next + 1 || (*end && *end != ',') || v < 1) {
                snprintf(why, cap, "a budget in MiB after @, from 1 to %lld",
                         (long long)BUDGET_MAX_MB);
                return -1;
            }
            mb = v, next = end;
        }
        if (add_pass(l, p, len, mb, why, cap))
            return -1;
        if (!*next)
            return 0;
        p = next + 1;
    }
}

static int add_replan(regc_replan_list *l, int64_t step, char *why, size_t cap)
{
    if (step < 1 || (l->n > 0 && step <= l->at[l->n - 1].step)) {
        snprintf(why, cap, "steps > 0 in ascending order (got %lld)", (long long)step);
        return -1;
    }
    if (l->n == REGC_MAX_REPLANS) {
        snprintf(why, cap, "at most %d steps", REGC_MAX_REPLANS);
        return -1;
    }
    l->at[l->n].step = step;
    return 0;
}

int regc_replans_from_text(const char *text, regc_replan_list *l, char *why, size_t cap)
{
    memset(l, 0, sizeof *l);
    if (!strcmp(text, "none"))
        return 0;
    char *copy = strdup(text);
    if (!copy) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    int rc = 0;
    char *save = NULL;
    for (char *part = strtok_r(copy, ";", &save); part && !rc; part = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(part, ':'), *end;
        long long step = strtoll(part, &end, 10);
        if (!colon || end != colon) {
            snprintf(why, cap, "STEP:passes, separated by ;");
            rc = -1;
        } else if (!(rc = add_replan(l, step, why, cap))) {
            rc = regc_passes_from_text(colon + 1, &l->at[l->n].passes, why, cap);
            l->n += rc == 0;
        }
    }
    free(copy);
    return rc;
}

int regc_passes_from_json(const cJSON *it, regc_pass_list *l, char *why, size_t cap)
{
    memset(l, 0, sizeof *l);
    if (!cJSON_IsArray(it)) {
        snprintf(why, cap, "an array of pass names or [name, budget_mb] pairs");
        return -1;
    }
    for (const cJSON *e = it->child; e; e = e->next) {
        const cJSON *name = e, *mb = NULL;
        if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2)
            name = e->child, mb = e->child->next;
        if (!cJSON_IsString(name) ||
            (mb && (!cJSON_IsNumber(mb) ||
                    !(mb->valuedouble >= 1 && mb->valuedouble <= (double)BUDGET_MAX_MB) ||
                    mb->valuedouble != floor(mb->valuedouble)))) {
            snprintf(why, cap,
                     "an array of pass names or [name, budget_mb] pairs, budgets "
                     "whole MiB from 1 to %lld",
                     (long long)BUDGET_MAX_MB);
            return -1;
        }
        if (add_pass(l, name->valuestring, strlen(name->valuestring),
                     mb ? (int64_t)mb->valuedouble : 0, why, cap))
            return -1;
    }
    return 0;
}

int regc_replans_from_json(const cJSON *it, regc_replan_list *l, char *why, size_t cap)
{
    memset(l, 0, sizeof *l);
    for (const cJSON *e = cJSON_IsArray(it) ? it->child : NULL; e; e = e->next) {
        /* compared in double first: a huge or fractional step never reaches
         * an int64 conversion */
        const double step =
            cJSON_IsArray(e) && cJSON_IsNumber(e->child) ? e->child->valuedouble : -1.0;
        if (cJSON_GetArraySize(e) != 2 || !(step >= 1.0 && step <= 9007199254740991.0) ||
            step != floor(step)) {
            snprintf(why, cap, "an array of [step, [passes]] pairs");
            return -1;
        }
        if (add_replan(l, (int64_t)e->child->valuedouble, why, cap) ||
            regc_passes_from_json(e->child->next, &l->at[l->n].passes, why, cap))
            return -1;
        l->n++;
    }
    if (!cJSON_IsArray(it)) {
        snprintf(why, cap, "an array of [step, [passes]] pairs");
        return -1;
    }
    return 0;
}

void regc_passes_to_text(const regc_pass_list *l, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    if (l->n == 0)
        snprintf(buf, cap, "none");
    for (int i = 0; i < l->n && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "", l->pass[i].name);
        if (l->pass[i].budget_bytes > 0 && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "@%lld",
                                  (long long)(l->pass[i].budget_bytes >> 20));
    }
}
