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
    OPT_BETAS,   /* two floats in (0, 1) from the field on: [beta1, beta2] in the file */
    /* a key of DeepSpeed's or Transformers' that changes nothing in regc
     * (the help says why): accepted whatever its value, or, with `values`,
     * of that JSON kind ("bool", "number", "string" or "object") */
    OPT_INERT,
    /* a key that changes nothing at the values `values` lists (a JSON
     * array) and would change the math at any other, which regc does not
     * do: any other value is refused with the help as the reason */
    OPT_NEUTRAL,
} opt_type;

enum {
    OPT_SHOW_DEFAULT = 1, /* the usage shows the default value */
    OPT_NULL_SETS = 2,    /* null in the file is a value (NULL), not "unset" */
    OPT_LIST_PRESETS = 4, /* the usage lists the model presets after the help */
    OPT_AUTO = 8,         /* "auto" (Hugging Face's placeholder) in the file leaves it unset */
    OPT_NOCASE = 16,      /* OPT_CHOICE: the file's name matched without regard to case */
    /* OPT_CHOICE: a spelling in the file may be a JSON bool, true meaning
     * choice bool_true and false choice bool_false (-1: unset) */
    OPT_BOOL = 32,
    /* OPT_STRING: true in the file is the directory `values` names, false
     * unsets it */
    OPT_BOOL_PATH = 64,
    /* a spelling whose value in (0, 1) is a fraction of the steps: it sets
     * train.warmup_ratio instead (Transformers 5's warmup_steps) */
    OPT_FRACTION = 128,
    /* a spelling whose value replaces what an earlier file gave the option
     * instead of contradicting it: a DeepSpeed config's scheduler replaces
     * Transformers' lr_scheduler_type, as its Trainer then makes none */
    OPT_OVERRIDES = 256,
};

/* Another spelling of an option in a file: DeepSpeed's or Transformers'
 * name for it, as a key path from the file's root. */
typedef struct {
    const char *path;  /* "train_micro_batch_size_per_gpu", "optimizer.params.lr" */
    int flags;         /* OPT_AUTO: "auto" leaves it unset; OPT_BOOL: a bool per bool_* */
    const char *unset; /* a value (JSON text) that leaves it unset, as null does: "-1" */
} regc_alias;

#define REGC_ALIAS_MAX 4

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
    /* the other spellings in a file; one parser reads them all, and the
     * usage lists them beside the key */
    regc_alias alias[REGC_ALIAS_MAX];
    const char *values; /* OPT_INERT, OPT_NEUTRAL, OPT_BOOL_PATH: see their comments */
    signed char bool_true, bool_false; /* OPT_BOOL */
};

#define REGC_OPTION_MAX 400 /* rows the config file can record as set */

extern const regc_option regc_option_table[];
extern const int regc_option_count;

/* Is `path` ("zero_optimization", "optimizer.params") a section: the
 * prefix of some row's key or spelling? */
int regc_option_section_known(const char *path);

/* The row a file's key path ("train.batch", "optimizer.params.lr") names,
 * or NULL; *alias: the spelling's index in the row's alias, or -1 for the
 * row's own section.key. */
const regc_option *regc_option_by_path(const char *path, int *alias);

/* The row for key in section ("train", "batch"), or NULL. */
const regc_option *regc_option_by_key(const char *section, const char *key);

/* The value of row o's field in s as text for messages and the usage
 * ("4", "0.0003", "bf16", "none"). */
void regc_option_value_text(const regc_option *o, const regc_train_settings *s, char *buf,
                            size_t cap);

/* The field of row o in s. */
void *regc_option_field(const regc_option *o, regc_train_settings *s);

/* The wording of what a value must be, for messages: on the command line
 * ("a positive integer") or in the file ("an integer >= 1"). */
void regc_option_describe(const regc_option *o, int in_file, char *buf, size_t cap);

/* Store integer v (already checked against the row's range) in the field. */
void regc_option_store_int(const regc_option *o, regc_train_settings *s, int64_t v);

/* Where each row's value came from (regc_origins, regc_train.h). */
enum {
    REGC_FROM_DEFAULT,
    REGC_FROM_FILE,    /* file[k], key[k]: the file and the key as it spells it */
    REGC_FROM_AUTO,    /* "auto" in file[k] at key[k]: regc's own value */
    REGC_FROM_FLAG,    /* key[k]: the flag */
    REGC_FROM_DERIVED, /* note[k]: what it follows from */
};
struct regc_origins {
    unsigned char kind[REGC_OPTION_MAX];
    /* a DeepSpeed scheduler's default that its file left out */
    unsigned char ds_default[REGC_OPTION_MAX];
    const char *file[REGC_OPTION_MAX];
    const char *key[REGC_OPTION_MAX];
    char note[REGC_OPTION_MAX][384];
};

/* Schedule passes as JSON (pass_options.c; as text: regc_train.h): 0, or
 * -1 with why the value is wrong in why. */
struct cJSON;
int regc_passes_from_json(const struct cJSON *it, regc_pass_list *l, char *why, size_t cap);
int regc_replans_from_json(const struct cJSON *it, regc_replan_list *l, char *why, size_t cap);

#endif
