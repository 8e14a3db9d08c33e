/* options.h — private to train/: the table of training options that
 * options.c (flags, usage) and config.c (the config file) both read. */
#ifndef REGC_OPTIONS_H
#define REGC_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "regc_train.h"

typedef enum {
    OPT_STRING,  /* a non-empty path or name; null in the file leaves it unset */
    OPT_INT,     /* an integer in [min, max], stored times `scale` */
    OPT_SEED,    /* any uint64 on the command line; 0 .. 2^53 - 1 in the file */
    OPT_FLOAT,   /* finite; > 0 when min > 0, else >= 0 */
    OPT_FLAG,    /* no value on the command line; true or false in the file */
    OPT_SWITCH,  /* on or off on the command line; true or false in the file */
    OPT_CHOICE,  /* one of `choices`, stored as its index */
    OPT_BACKEND, /* "cpu", "cuda" or "cuda:N" */
    OPT_PASSES,  /* regc_pass_list: "name[@MB],..."; in the file [name or [name, MB], ...] */
    OPT_REPLANS, /* regc_replan_list: "STEP:passes;..."; in the file [[STEP, passes], ...] */
    OPT_MODULES, /* regc_lora_targets: "a,b"; in the file ["a", "b"] or a regular expression */
} opt_type;

enum {
    OPT_SHOW_DEFAULT = 1, /* the usage shows the default value */
    OPT_NULL_SETS = 2,    /* null in the file is a value (NULL), not "unset" */
    OPT_LIST_PRESETS = 4, /* the usage lists the model presets after the help */
};

struct regc_option {
    const char *section; /* "train" or "compile": where the usage lists it */
    const char *key;     /* the config file's key in section; NULL: a flag only */
    const char *flag;    /* "--batch"; NULL: a file key only */
    opt_type type;
    const char *metavar;        /* "<B>" */
    double min, max;            /* OPT_INT; OPT_FLOAT reads min only */
    int64_t scale;              /* OPT_INT: stored value = value * scale (0: 1) */
    const char *const *choices; /* OPT_CHOICE, NULL-terminated */
    size_t offset, size;        /* the field in regc_train_settings */
    int flags;                  /* OPT_SHOW_DEFAULT, ... */
    const char *help;
};

#define REGC_OPTION_MAX 80 /* rows the config file can record as set */

extern const regc_option regc_option_table[];
extern const int regc_option_count;

/* Does the table have keys in this section? */
int regc_option_section_known(const char *section);
/* A key regc knows by name (DeepSpeed's) but does not take yet. */
int regc_option_not_yet(const char *section, const char *key);

/* The row for key in section ("train", "batch"), or NULL. */
const regc_option *regc_option_by_key(const char *section, const char *key);

/* The field of row o in s. */
void *regc_option_field(const regc_option *o, regc_train_settings *s);

/* The wording of what a value must be, for messages: on the command line
 * ("a positive integer") or in the file ("an integer >= 1"). */
void regc_option_describe(const regc_option *o, int in_file, char *buf, size_t cap);

/* Store integer v (already checked against the row's range) in the field. */
void regc_option_store_int(const regc_option *o, regc_train_settings *s, int64_t v);

/* Schedule passes as JSON (pass_options.c; as text: regc_train.h): 0, or
 * -1 with why the value is wrong in why. */
struct cJSON;
int regc_passes_from_json(const struct cJSON *it, regc_pass_list *l, char *why, size_t cap);
int regc_replans_from_json(const struct cJSON *it, regc_replan_list *l, char *why, size_t cap);

#endif
