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

/* The options' names in their enums' order, NULL-terminated: the config
 * file and the flags (train/options.c) take these same tables. */
const char *const regc_level_names[] = {"O0", "O1", "O2", NULL};
const char *const regc_precision_names[] = {"fp32", "bf16", NULL};
const char *const regc_recompute_names[] = {"none", "selective", "full", "auto", NULL};

/* names[i]'s index, or -1 */
static int name_index(const char *const *names, const char *name)
{
    for (int i = 0; name && names[i]; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -1;
}

int regc_level_from_name(const char *name) { return name_index(regc_level_names, name); }

int regc_precision_from_name(const char *name) { return name_index(regc_precision_names, name); }

/* the names in a table, its NULL left out */
#define NAMES(table) (sizeof table / sizeof *table - 1)

const char *regc_level_name(regc_level l)
{
    return (size_t)l < NAMES(regc_level_names) ? regc_level_names[l] : "?";
}

const char *regc_precision_name(regc_precision p)
{
    return (size_t)p < NAMES(regc_precision_names) ? regc_precision_names[p] : "?";
}

const char *regc_recompute_name(regc_recompute r)
{
    return (size_t)r < NAMES(regc_recompute_names) ? regc_recompute_names[r] : "?";
}
