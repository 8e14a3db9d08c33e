/* options.c — the compile options' defaults and the levels' names, which
 * the driver, the step program's dump and the cache's labels all use. */
#include <string.h>

#include "region_internal.h"

void regc_compile_options_default(regc_compile_options *o)
{
    memset(o, 0, sizeof *o);
    o->regional = 1;
    o->level = REGC_LEVEL_O1;
    o->inline_back = 1;
    o->prefetch_floats = -1; /* one unit ahead */
    o->deepcompile = 1;
    o->recompute = REGC_RECOMPUTE_AUTO; /* nothing, unless a budget asks */
    o->recompute_ratio = -1.0;
    o->offload_limit = -1; /* every activation that qualifies */
    regc_pass_list_default(&o->passes);
}

static const char *const level_names[] = {"O0", "O1", "O2"};

int regc_level_from_name(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, level_names[i]))
            return i;
    return -1;
}

const char *regc_level_name(regc_level l) { return (unsigned)l < 3 ? level_names[l] : "?"; }

static const char *const precision_names[] = {"fp32", "bf16"};

int regc_precision_from_name(const char *name)
{
    for (int i = 0; i < 2; i++)
        if (name && !strcmp(name, precision_names[i]))
            return i;
    return -1;
}

const char *regc_precision_name(regc_precision p)
{
    return (unsigned)p < 2 ? precision_names[p] : "?";
}

static const char *const recompute_names[] = {"none", "selective", "full", "auto"};

int regc_recompute_from_name(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && !strcmp(name, recompute_names[i]))
            return i;
    return -1;
}

const char *regc_recompute_name(regc_recompute r)
{
    return (unsigned)r < 4 ? recompute_names[r] : "?";
}
