/* Settings: the table in settings.def, parsed from the environment.
 *
 * config_load can run inside the program's first malloc, so nothing here allocates: getenv,
 * fixed buffers and the non-allocating logger only.
 *
 * Value rules (the same for the defaults in settings.def):
 *  - surrounding spaces and tabs are ignored; an empty value means "unset": the default, silently;
 *  - sizes: base-10 digits with an optional suffix K, M, G, T or KiB, MiB, GiB, TiB (any letter
 *    case), all powers of 1024.  "KB"/"MB"/... are refused: some read them as powers of 1000,
 *    and guessing wrong by 2-10% silently is worse than one warning;
 *  - percentages: "N%" with N a whole number 0..100, of physical memory;
 *  - no sign, no fraction, no hex, nothing after the number; overflow is an error;
 *  - booleans: 0/1, yes/no, true/false, on/off (any letter case); modes: off, observe, pin, full;
 *  - a bad or out-of-range value prints exactly one warning line naming the variable, the text
 *    and the default, and the default is used;
 *  - a PINSHIM_* name that is not a setting but one slip away from one (PINSHIM_BUGDET) prints
 *    one line naming the setting; names far from every setting belong to other tools;
 *  - none of these lines while PINSHIM_CHECKED holds the checksum of the environment: the
 *    wrapper printed them already, once for the whole command. */
#include "base/config.h"
#include "base/log.h"
#include "base/os.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/sysinfo.h>

struct shim_config shim_cfg;

#define SZ_K (UINT64_C(1) << 10)
#define SZ_M (UINT64_C(1) << 20)
#define SZ_G (UINT64_C(1) << 30)
#define SZ_T (UINT64_C(1) << 40)

enum setting_kind { KIND_ENUM, KIND_SIZE, KIND_SIZE_PCT, KIND_UINT, KIND_BOOL, KIND_PATH };

struct setting {
    const char *name;
    enum setting_kind kind;
    size_t offset;
    size_t field_size;
    const char *default_text;
    uint64_t min, max;
    const char *unit;
    const char *description;
    const char *const *names;     /* KIND_ENUM: the value names, in the enum's order */
    unsigned nnames;
};

/* A setting's field must have the C type its kind stores, or the parser would write the wrong
 * width: checked at compile time for every row. */
#define FIELD_TYPE_MATCHES(kind, field)                                                  \
    _Generic(&((struct shim_config *)0)->field,                                          \
        enum shim_mode *: KIND_##kind == KIND_ENUM,                                      \
        enum bounce_mode *: KIND_##kind == KIND_ENUM,                                    \
        uint64_t *: (KIND_##kind == KIND_SIZE || KIND_##kind == KIND_SIZE_PCT ||         \
                     KIND_##kind == KIND_UINT),                                          \
        bool *: KIND_##kind == KIND_BOOL,                                                \
        char (*)[sizeof(shim_cfg.report)]: KIND_##kind == KIND_PATH,                     \
        default: 0)
#define SETTING(NAME, kind, field, default_text, min, max, unit, description)            \
    _Static_assert(FIELD_TYPE_MATCHES(kind, field), #NAME ": field type does not fit its kind");
/* The parser stores an enum setting as an int. */
_Static_assert(sizeof(enum shim_mode) == sizeof(int) && sizeof(enum bounce_mode) == sizeof(int),
               "enum settings are int-sized");
#include "base/settings.def"
#undef SETTING

static const char *const mode_names[] = {
    [MODE_OFF] = "off", [MODE_OBSERVE] = "observe", [MODE_PIN] = "pin", [MODE_FULL] = "full",
};
static const char *const bounce_names[] = {
    [BOUNCE_OFF] = "off", [BOUNCE_PINNED] = "pinned", [BOUNCE_ALL] = "all",
};
/* An enum setting's names, by its field's type. */
#define ENUM_NAMES(field)                                                                \
    _Generic(&((struct shim_config *)0)->field,                                          \
        enum shim_mode *: mode_names, enum bounce_mode *: bounce_names, default: NULL)
#define ENUM_COUNT(field)                                                                \
    _Generic(&((struct shim_config *)0)->field,                                          \
        enum shim_mode *: sizeof mode_names / sizeof mode_names[0],                      \
        enum bounce_mode *: sizeof bounce_names / sizeof bounce_names[0], default: 0)

static const struct setting settings[] = {
#define SETTING(NAME, kind, field, default_text, min, max, unit, description)            \
    { #NAME, KIND_##kind, offsetof(struct shim_config, field),                           \
      sizeof(((struct shim_config *)0)->field), default_text, min, max, unit, description, \
      ENUM_NAMES(field), (unsigned)ENUM_COUNT(field) },
#include "base/settings.def"
#undef SETTING
};
#define SETTING_COUNT (sizeof(settings) / sizeof(settings[0]))

const char *config_mode_name(enum shim_mode m)
{
    if ((unsigned)m < sizeof(mode_names) / sizeof(mode_names[0]))
        return mode_names[m];
    return "unknown";
}

/* ---- parsers ---- */

/* Leading base-10 digits into *out; returns the first character after them, or NULL on no
 * digits or overflow. */
static const char *parse_digits(const char *p, uint64_t *out)
{
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p))
        return NULL;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return NULL;
        v = v * 10 + d;
    }
    *out = v;
    return p;
}

int config_parse_uint(const char *text, uint64_t *out)
{
    uint64_t v;
    const char *end = text ? parse_digits(text, &v) : NULL;
    if (!end || *end)
        return -1;
    *out = v;
    return 0;
}

/* log2 of the suffix multiplier, or -1 when the suffix is not one we accept. */
static int size_suffix_shift(const char *s)
{
    static const char letters[] = "KMGT";
    if (!*s)
        return 0;
    const char *hit = strchr(letters, toupper((unsigned char)s[0]));
    if (!hit)
        return -1;
    if (s[1] && strcasecmp(s + 1, "iB") != 0)
        return -1;
    return 10 * (int)(hit - letters + 1);
}

int config_parse_size(const char *text, uint64_t *out)
{
    uint64_t v;
    const char *end = text ? parse_digits(text, &v) : NULL;
    if (!end)
        return -1;
    int shift = size_suffix_shift(end);
    if (shift < 0 || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = v << shift;
    return 0;
}

int config_parse_size_or_percent(const char *text, uint64_t total, uint64_t *out)
{
    if (!text)
        return -1;
    size_t len = strlen(text);
    if (len && text[len - 1] == '%') {
        uint64_t pct;
        const char *end = parse_digits(text, &pct);
        if (!end || end != text + len - 1 || pct > 100)
            return -1;
        /* total * pct / 100 without overflowing for totals near 2^64 */
        *out = total / 100 * pct + total % 100 * pct / 100;
        return 0;
    }
    return config_parse_size(text, out);
}

int config_parse_bool(const char *text, bool *out)
{
    static const char *const yes[] = { "1", "yes", "true", "on" };
    static const char *const no[] = { "0", "no", "false", "off" };
    if (!text)
        return -1;
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (!strcasecmp(text, yes[i])) { *out = true; return 0; }
        if (!strcasecmp(text, no[i])) { *out = false; return 0; }
    }
    return -1;
}

/* The index of text among an enum setting's names (any letter case), or -1. */
static int parse_enum(const char *text, const struct setting *s)
{
    for (unsigned m = 0; m < s->nnames; m++)
        if (!strcasecmp(text, s->names[m]))
            return (int)m;
    return -1;
}

const char *config_bounce_name(enum bounce_mode m)
{
    if ((unsigned)m < sizeof(bounce_names) / sizeof(bounce_names[0]))
        return bounce_names[m];
    return "unknown";
}

uint64_t config_physical_memory(void)
{
    /* sysinfo rather than sysconf(_SC_PHYS_PAGES): older glibc answers the latter by reading
     * /proc/meminfo through stdio, which allocates. */
    struct sysinfo si;
    if (sysinfo(&si) != 0)
        return 0;
    return (uint64_t)si.totalram * (si.mem_unit ? si.mem_unit : 1);
}

/* ---- applying one setting ---- */

/* Parse text for setting s and store it; -1 when bad or out of range (nothing stored). */
static int apply_value(const struct setting *s, const char *text, uint64_t phys_mem)
{
    char *field = (char *)&shim_cfg + s->offset;
    uint64_t v;
    bool b;
    int m;

    switch (s->kind) {
    case KIND_ENUM:
        /* Every enum field is an int-sized C enum (checked by FIELD_TYPE_MATCHES' types). */
        if ((m = parse_enum(text, s)) < 0)
            return -1;
        *(int *)field = m;
        return 0;
    case KIND_BOOL:
        if (config_parse_bool(text, &b) != 0)
            return -1;
        *(bool *)field = b;
        return 0;
    case KIND_PATH:
        if (strlen(text) >= s->field_size)
            return -1;
        memcpy(field, text, strlen(text) + 1);
        return 0;
    case KIND_SIZE_PCT:
        if (strchr(text, '%')) {
            if (config_parse_size_or_percent(text, phys_mem, &v) != 0)
                return -1;
            *(uint64_t *)field = v;
            return 0;
        }
        __attribute__((fallthrough));   /* a plain size, range-checked below */
    case KIND_SIZE:
        if (config_parse_size(text, &v) != 0)
            return -1;
        break;
    case KIND_UINT:
        if (config_parse_uint(text, &v) != 0)
            return -1;
        break;
    default:
        return -1;
    }
    if (v < s->min || v > s->max)
        return -1;
    *(uint64_t *)field = v;
    return 0;
}

/* A size as the table writes it: the largest K/M/G/T unit that divides it exactly. */
static void format_size(uint64_t v, char *buf, size_t bufsz)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && v && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, bufsz, "%llu", (unsigned long long)v);
    else
        snprintf(buf, bufsz, "%llu%c", (unsigned long long)v, units[u]);
}

static void format_range(const struct setting *s, char *buf, size_t bufsz)
{
    char lo[32], hi[32];
    switch (s->kind) {
    case KIND_ENUM: {
        size_t o = 0;
        buf[0] = '\0';
        for (unsigned m = 0; m < s->nnames && o < bufsz; m++)
            o += (size_t)snprintf(buf + o, bufsz - o, "%s%s", m ? ", " : "", s->names[m]);
        return;
    }
    case KIND_BOOL:
        snprintf(buf, bufsz, "0/1, yes/no, true/false, on/off");
        return;
    case KIND_PATH:
        snprintf(buf, bufsz, "path of under %zu bytes", s->field_size);
        return;
    case KIND_UINT:
        snprintf(buf, bufsz, "%llu..%llu", (unsigned long long)s->min,
                 (unsigned long long)s->max);
        return;
    case KIND_SIZE:
    case KIND_SIZE_PCT:
        format_size(s->min, lo, sizeof lo);
        format_size(s->max, hi, sizeof hi);
        snprintf(buf, bufsz, "%s..%s%s", lo, hi, s->kind == KIND_SIZE_PCT ? " or 0%..100%" : "");
        return;
    }
    snprintf(buf, bufsz, "?");
}

/* The user's text, made safe for a one-line message: non-printable bytes as \xNN, cut short. */
static void quote_for_log(const char *text, char *buf, size_t bufsz)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (o + 8 >= bufsz) {
            memcpy(buf + o, "...", 4);
            return;
        }
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[o++] = (char)*p;
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[*p >> 4];
            buf[o++] = hex[*p & 15];
        }
    }
    buf[o] = '\0';
}

/* Why a value is refused, in one line: the variable, the text as far as it is printable, and
 * what the setting expects. */
static void describe_bad_value(const struct setting *s, const char *raw, char *buf, size_t bufsz)
{
    static const char *const expected_prefix[] = {
        [KIND_ENUM] = "one of ", [KIND_SIZE] = "a size ", [KIND_SIZE_PCT] = "a size or percentage ",
        [KIND_UINT] = "a whole number ", [KIND_BOOL] = "one of ", [KIND_PATH] = "a ",
    };
    char shown[96], range[96];
    quote_for_log(raw, shown, sizeof shown);
    format_range(s, range, sizeof range);
    snprintf(buf, bufsz, "%s=\"%s\" is not valid (expected %s%s%s)", s->name, shown,
             expected_prefix[s->kind], range,
             s->kind == KIND_SIZE ? " with K/M/G/T or KiB/MiB/GiB/TiB (x1024)" : "");
}

static void warn_bad_value(const struct setting *s, const char *raw)
{
    char why[400];
    describe_bad_value(s, raw, why, sizeof why);
    shim_log(LOG_WARN, "%s; using the default %s", why,
             *s->default_text ? s->default_text : "(unset)");
}

/* Copy text without surrounding spaces and tabs; -1 when it does not fit. */
static int trim_into(const char *text, char *buf, size_t bufsz)
{
    while (*text == ' ' || *text == '\t')
        text++;
    size_t len = strlen(text);
    while (len && (text[len - 1] == ' ' || text[len - 1] == '\t'))
        len--;
    if (len >= bufsz)
        return -1;
    memcpy(buf, text, len);
    buf[len] = '\0';
    return 0;
}

static const char *libc_getenv(const char *name) { return getenv(name); }

/* ---- names that are not settings ---- */

#define NAME_PREFIX "PINSHIM_"
#define NAME_PREFIX_LEN (sizeof NAME_PREFIX - 1)
#define NAME_MAX_LEN 64   /* longer names are no slip of any setting's name */

static const struct setting *setting_named(const char *name, size_t len)
{
    for (size_t i = 0; i < SETTING_COUNT; i++)
        if (strlen(settings[i].name) == len && !memcmp(settings[i].name, name, len))
            return &settings[i];
    return NULL;
}

/* Edits (a letter added, dropped or changed, or two neighbours swapped) between a and b, any
 * letter case; on the stack, as everything here. */
static unsigned typing_distance(const char *a, size_t la, const char *b, size_t lb)
{
    unsigned rows[3][NAME_MAX_LEN + 1];
    unsigned *before = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (unsigned)i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned cost = toupper((unsigned char)a[i - 1]) != toupper((unsigned char)b[j - 1]);
            unsigned best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && toupper((unsigned char)a[i - 1]) == toupper((unsigned char)b[j - 2]) &&
                toupper((unsigned char)a[i - 2]) == toupper((unsigned char)b[j - 1]) &&
                before[j - 2] + 1 < best)
                best = before[j - 2] + 1;
            cur[j] = best;
        }
        unsigned *t = before;
        before = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

/* The setting a name not in the table was probably meant to be, or NULL when none is within a
 * slip: one edit for short names, one per four letters after the prefix for longer ones.  A
 * name far from every setting (a variable of some other tool, such as PINSHIM_LIB of the
 * wrapper) is none of the library's business. */
static const struct setting *closest_setting(const char *name, size_t len)
{
    const struct setting *best = NULL;
    unsigned best_distance = ~0u;
    if (len > NAME_MAX_LEN)
        return NULL;
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        size_t slen = strlen(settings[i].name);
        unsigned allowed = (unsigned)((slen - NAME_PREFIX_LEN) / 4);
        if (allowed < 1)
            allowed = 1;
        unsigned d = typing_distance(name, len, settings[i].name, slen);
        if (d <= allowed && d < best_distance) {
            best = &settings[i];
            best_distance = d;
        }
    }
    return best;
}

static bool has_name_prefix(const char *entry)
{
    return !strncasecmp(entry, NAME_PREFIX, NAME_PREFIX_LEN);
}

static size_t name_length(const char *entry)
{
    const char *eq = strchr(entry, '=');
    return eq ? (size_t)(eq - entry) : strlen(entry);
}

static void describe_unknown_name(const char *name, size_t len, const struct setting *near,
                                  char *buf, size_t bufsz)
{
    char shown[NAME_MAX_LEN + 16], copy[NAME_MAX_LEN + 1];
    size_t n = len < NAME_MAX_LEN ? len : NAME_MAX_LEN;
    memcpy(copy, name, n);
    copy[n] = '\0';
    quote_for_log(copy, shown, sizeof shown);
    if (near)
        snprintf(buf, bufsz, "%s is not a pinshim setting (did you mean %s?)", shown, near->name);
    else
        snprintf(buf, bufsz, "%s is not a pinshim setting", shown);
}

/* ---- the checksum of what was already reported ---- */

static uint64_t fnv1a(uint64_t h, const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static uint64_t entry_hash(const char *name, const char *value)
{
    uint64_t h = fnv1a(UINT64_C(0xcbf29ce484222325), name, strlen(name));
    h = fnv1a(h, "=", 1);
    return fnv1a(h, value, strlen(value));
}

uint64_t config_env_checksum(const char *(*getenv_fn)(const char *name), char *const *envp)
{
    if (!getenv_fn)
        getenv_fn = libc_getenv;
    uint64_t sum = 0;   /* a sum, so that the order of the environment does not matter */
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        if (settings[i].offset == offsetof(struct shim_config, checked))
            continue;   /* what the sum is compared with */
        const char *raw = getenv_fn(settings[i].name);
        if (raw)
            sum += entry_hash(settings[i].name, raw);
    }
    for (char *const *e = envp; e && *e; e++) {
        size_t len = name_length(*e);
        if (has_name_prefix(*e) && !setting_named(*e, len))
            sum += fnv1a(UINT64_C(0xcbf29ce484222325), *e, strlen(*e));
    }
    return sum;
}

/* True when PINSHIM_CHECKED says this very environment was reported on already. */
static bool already_reported(const char *(*getenv_fn)(const char *name), char *const *envp)
{
    char value[32];
    uint64_t checked;
    const char *raw = getenv_fn("PINSHIM_CHECKED");
    if (!raw || trim_into(raw, value, sizeof value) != 0 || config_parse_uint(value, &checked) != 0)
        return false;
    return checked != 0 && checked == config_env_checksum(getenv_fn, envp);
}

/* ---- loading ---- */

unsigned config_load_env(const char *(*getenv_fn)(const char *name), char *const *envp)
{
    if (!getenv_fn)
        getenv_fn = libc_getenv;
    uint64_t phys_mem = config_physical_memory();
    bool quiet = already_reported(getenv_fn, envp);
    unsigned warnings = 0;
    char value[1024];

    memset(&shim_cfg, 0, sizeof shim_cfg);
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = &settings[i];
        /* Defaults go through the parser too (a unit test checks each one parses). */
        apply_value(s, s->default_text, phys_mem);

        const char *raw = getenv_fn(s->name);
        if (!raw)
            continue;
        if (trim_into(raw, value, sizeof value) != 0) {
            warnings++;
            if (!quiet)
                warn_bad_value(s, raw);
            continue;
        }
        if (!value[0])
            continue;
        if (apply_value(s, value, phys_mem) != 0) {
            warnings++;
            if (!quiet)
                warn_bad_value(s, raw);
            apply_value(s, s->default_text, phys_mem);   /* a failed parse stores nothing, but be sure */
        }
    }
    for (char *const *e = envp; e && *e; e++) {
        size_t len = name_length(*e);
        if (!has_name_prefix(*e) || setting_named(*e, len))
            continue;
        const struct setting *near = closest_setting(*e, len);
        if (near) {
            char why[256];
            warnings++;
            describe_unknown_name(*e, len, near, why, sizeof why);
            if (!quiet)
                shim_log(LOG_WARN, "%s; it is ignored", why);
        }
    }
    return warnings;
}

void config_load(const char *(*getenv_fn)(const char *name))
{
    extern char **environ;
    config_load_env(getenv_fn, getenv_fn ? NULL : environ);
}

int config_check(const char *name, const char *value, char *why, size_t whysz)
{
    char trimmed[1024];
    size_t len = strlen(name);
    const struct setting *s = setting_named(name, len);
    if (whysz)
        why[0] = '\0';
    if (!s) {
        describe_unknown_name(name, len, closest_setting(name, len), why, whysz);
        return -2;
    }
    struct shim_config saved = shim_cfg;   /* apply_value stores into the one config */
    int rc = 0;
    if (trim_into(value, trimmed, sizeof trimmed) != 0 ||
        (trimmed[0] && apply_value(s, trimmed, config_physical_memory()) != 0)) {
        describe_bad_value(s, value, why, whysz);
        rc = -1;
    }
    shim_cfg = saved;
    return rc;
}

/* ---- the table for the README check ---- */

void config_print_table(int fd)
{
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = &settings[i];
        char line[1024], range[96];
        format_range(s, range, sizeof range);
        int n = snprintf(line, sizeof line, "%s|%s|%s|%s|%s\n", s->name,
                         *s->default_text ? s->default_text : "\"\"", range, s->unit,
                         s->description);
        if (n > 0)
            os_write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    }
}

/* ---- %p / %r in file names ---- */

/* The process's rank under the usual launchers, made safe for a file name; "x" when none. */
static void find_rank(char *buf, size_t bufsz)
{
    static const char *const vars[] = { "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID" };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            size_t o = 0;
            for (; v[o] && o + 1 < bufsz; o++)
                buf[o] = (isalnum((unsigned char)v[o]) || v[o] == '-' || v[o] == '.') ? v[o] : '_';
            buf[o] = '\0';
            return;
        }
    }
    snprintf(buf, bufsz, "x");
}

bool config_expand_path_checked(const char *tmpl, char *out, size_t outsz)
{
    char piece[32];
    size_t o = 0;
    if (!outsz)
        return false;
    for (const char *p = tmpl; *p; p++) {
        const char *add = piece;
        if (*p == '%' && p[1] == 'p') {
            snprintf(piece, sizeof piece, "%d", (int)getpid());
            p++;
        } else if (*p == '%' && p[1] == 'r') {
            find_rank(piece, sizeof piece);
            p++;
        } else if (*p == '%' && p[1] == '%') {
            add = "%";
            p++;
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        size_t len = strlen(add);
        if (o + len >= outsz) {
            out[0] = '\0';
            return false;
        }
        memcpy(out + o, add, len);
        o += len;
    }
    out[o] = '\0';
    return true;
}
