/* Settings parser, the one-warning rule, path expansion, and the logger.
 * Run with --print-table to print the settings table (tests/check_settings_doc.sh uses it). */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/log.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a fake environment for config_load ---- */

#define ENV_MAX 32
static const char *env_names[ENV_MAX], *env_values[ENV_MAX];
static int env_count;

static void env_clear(void) { env_count = 0; }
static void env_set(const char *name, const char *value)
{
    env_names[env_count] = name;
    env_values[env_count++] = value;
}
static const char *fake_getenv(const char *name)
{
    for (int i = 0; i < env_count; i++)
        if (!strcmp(env_names[i], name))
            return env_values[i];
    return NULL;
}

/* ---- capturing the log ---- */

static int log_pipe[2];
static char captured[65536];

static void capture_start(void)
{
    if (pipe(log_pipe) != 0) {
        perror("pipe");
        exit(2);
    }
    fcntl(log_pipe[0], F_SETFL, O_NONBLOCK);
    log_set_fd(log_pipe[1]);
}

/* Stops capturing; returns the number of lines logged, text in `captured`. */
static int capture_stop(void)
{
    log_set_fd(2);
    close(log_pipe[1]);
    size_t len = 0;
    ssize_t n;
    while (len < sizeof captured - 1 && (n = read(log_pipe[0], captured + len, sizeof captured - 1 - len)) > 0)
        len += (size_t)n;
    captured[len] = '\0';
    close(log_pipe[0]);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += captured[i] == '\n';
    return lines;
}

/* Load with one variable set; returns the number of warning lines. */
static int load_one(const char *name, const char *value)
{
    env_clear();
    env_set(name, value);
    capture_start();
    config_load(fake_getenv);
    return capture_stop();
}

#define KB (UINT64_C(1) << 10)
#define MB (UINT64_C(1) << 20)
#define GB (UINT64_C(1) << 30)
#define TB (UINT64_C(1) << 40)

static void test_parse_size(void)
{
    static const struct { const char *text; uint64_t want; } good[] = {
        { "0", 0 }, { "64", 64 }, { "0064", 64 }, { "64K", 64 * KB }, { "64k", 64 * KB },
        { "4KiB", 4 * KB }, { "4kib", 4 * KB }, { "2M", 2 * MB }, { "2MiB", 2 * MB },
        { "3G", 3 * GB }, { "3GiB", 3 * GB }, { "1T", TB }, { "1TiB", TB },
        { "18446744073709551615", UINT64_MAX }, { "16777215T", 16777215 * TB },
    };
    static const char *const bad[] = {
        "", "K", "64KB", "64kb", "64MB", "64 K", " 64", "64 ", "-1", "+1", "12Q", "1.5G", "0x10",
        "64Ki", "64KiBs", "64B", "99999999999999999999", "18446744073709551616", "17179869184T",
        "16777216T", "16384P",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 12345;
        int rc = config_parse_size(good[i].text, &v);
        CHECKF(rc == 0 && v == good[i].want, "parse_size \"%s\" = %llu", good[i].text,
               (unsigned long long)good[i].want);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 12345;
        int rc = config_parse_size(bad[i], &v);
        CHECKF(rc == -1 && v == 12345, "parse_size rejects \"%s\" and stores nothing", bad[i]);
    }
    uint64_t v;
    CHECK(config_parse_size(NULL, &v) == -1);
}

static void test_parse_percent(void)
{
    uint64_t v = 0;
    CHECK(config_parse_size_or_percent("0%", 1000, &v) == 0 && v == 0);
    CHECK(config_parse_size_or_percent("100%", 1000, &v) == 0 && v == 1000);
    CHECK(config_parse_size_or_percent("25%", 1000, &v) == 0 && v == 250);
    CHECK(config_parse_size_or_percent("33%", 1001, &v) == 0 && v == 330);
    CHECK(config_parse_size_or_percent("25%", UINT64_MAX, &v) == 0 && v == UINT64_MAX / 4);
    CHECK(config_parse_size_or_percent("100%", UINT64_MAX, &v) == 0 && v == UINT64_MAX);
    CHECK(config_parse_size_or_percent("2G", 1000, &v) == 0 && v == 2 * GB);
    static const char *const bad[] = { "101%", "%", "-5%", "5 %", "50%%", "5.5%", "%5", "5K%",
                                       "99999999999999999999%", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 7;
        CHECKF(config_parse_size_or_percent(bad[i], 1000, &v) == -1 && v == 7,
               "size_or_percent rejects \"%s\"", bad[i]);
    }
}

static void test_parse_uint_bool(void)
{
    uint64_t v = 0;
    CHECK(config_parse_uint("8", &v) == 0 && v == 8);
    CHECK(config_parse_uint("0", &v) == 0 && v == 0);
    CHECK(config_parse_uint("18446744073709551615", &v) == 0 && v == UINT64_MAX);
    CHECK(config_parse_uint("18446744073709551616", &v) == -1);
    CHECK(config_parse_uint("8K", &v) == -1);
    CHECK(config_parse_uint("", &v) == -1);
    CHECK(config_parse_uint("-1", &v) == -1);
    CHECK(config_parse_uint(" 1", &v) == -1);

    static const char *const yes[] = { "1", "yes", "YES", "true", "True", "on", "ON" };
    static const char *const no[] = { "0", "no", "No", "false", "FALSE", "off", "Off" };
    static const char *const bad[] = { "", "2", "maybe", "y", "n", "enable", "01", " 1" };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        bool b = false;
        CHECKF(config_parse_bool(yes[i], &b) == 0 && b, "bool \"%s\" is true", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        bool b = true;
        CHECKF(config_parse_bool(no[i], &b) == 0 && !b, "bool \"%s\" is false", no[i]);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool b = true;
        CHECKF(config_parse_bool(bad[i], &b) == -1 && b, "bool rejects \"%s\"", bad[i]);
    }
    CHECK(!strcmp(config_mode_name(MODE_OFF), "off") && !strcmp(config_mode_name(MODE_FULL), "full"));
    CHECK(!strcmp(config_mode_name((enum shim_mode)42), "unknown"));
}

static void test_defaults(void)
{
    env_clear();
    capture_start();
    config_load(fake_getenv);
    int lines = capture_stop();
    CHECKF(lines == 0, "defaults load without a warning (every default parses)");
    uint64_t phys = config_physical_memory();
    CHECK(phys > 0);
    CHECK(shim_cfg.mode == MODE_FULL);
    CHECK(shim_cfg.min_size == 64 * KB);
    CHECK(shim_cfg.budget == phys / 100 * 25 + phys % 100 * 25 / 100);
    CHECK(shim_cfg.node_budget == 0);
    CHECK(shim_cfg.rewrite_min == 256 * KB);
    CHECK(shim_cfg.staging_min == 1 * MB);
    CHECK(shim_cfg.staging_chunk == 16 * MB);
    CHECK(shim_cfg.staging_buffers == 3);
    CHECK(shim_cfg.copy_threads == 0);   /* the CPUs local to the GPU */
    CHECK(shim_cfg.streaming_stores);
    CHECK(shim_cfg.bw_h2d_pageable == 9000);
    CHECK(shim_cfg.bw_d2h_pageable == 11000);
    CHECK(shim_cfg.bw_pinned == 54000);
    CHECK(shim_cfg.reg_cost_resident == 45000);
    CHECK(shim_cfg.reg_cost_fault == 360000);
    CHECK(!shim_cfg.trust_async && !shim_cfg.calibrate && shim_cfg.nvtx);
    CHECK(shim_cfg.callsite_min == 64 * MB);
    CHECK(!shim_cfg.rewrite_always);
    CHECK(shim_cfg.log_level == 0);
    CHECK(shim_cfg.report[0] == '\0' && shim_cfg.stats[0] == '\0');

    /* NULL means the real environment */
    unsetenv("PINSHIM_MIN_SIZE");
    setenv("PINSHIM_COPY_THREADS", "5", 1);
    config_load(NULL);
    CHECK(shim_cfg.copy_threads == 5 && shim_cfg.min_size == 64 * KB);
    unsetenv("PINSHIM_COPY_THREADS");
}

static void test_valid_values(void)
{
    uint64_t phys = config_physical_memory();
    CHECK(load_one("PINSHIM_MIN_SIZE", " 128K\t") == 0 && shim_cfg.min_size == 128 * KB);
    CHECK(load_one("PINSHIM_MIN_SIZE", "4K") == 0 && shim_cfg.min_size == 4 * KB);
    CHECK(load_one("PINSHIM_MIN_SIZE", "1T") == 0 && shim_cfg.min_size == TB);
    CHECK(load_one("PINSHIM_MODE", "Observe") == 0 && shim_cfg.mode == MODE_OBSERVE);
    CHECK(load_one("PINSHIM_MODE", "off") == 0 && shim_cfg.mode == MODE_OFF);
    CHECK(load_one("PINSHIM_MODE", "pin") == 0 && shim_cfg.mode == MODE_PIN);
    CHECK(load_one("PINSHIM_BUDGET", "0") == 0 && shim_cfg.budget == 0);
    CHECK(load_one("PINSHIM_BUDGET", "0%") == 0 && shim_cfg.budget == 0);
    CHECK(load_one("PINSHIM_BUDGET", "100%") == 0 && shim_cfg.budget == phys);
    CHECK(load_one("PINSHIM_BUDGET", "2G") == 0 && shim_cfg.budget == 2 * GB);
    CHECK(load_one("PINSHIM_NODE_BUDGET", "50%") == 0 &&
          shim_cfg.node_budget == phys / 100 * 50 + phys % 100 * 50 / 100);
    CHECK(load_one("PINSHIM_STAGING_MIN", "0") == 0 && shim_cfg.staging_min == 0);
    CHECK(load_one("PINSHIM_STAGING_CHUNK", "1G") == 0 && shim_cfg.staging_chunk == GB);
    CHECK(load_one("PINSHIM_STAGING_BUFFERS", "8") == 0 && shim_cfg.staging_buffers == 8);
    CHECK(load_one("PINSHIM_COPY_THREADS", "64") == 0 && shim_cfg.copy_threads == 64);
    CHECK(load_one("PINSHIM_BW_PINNED", "1000000") == 0 && shim_cfg.bw_pinned == 1000000);
    CHECK(load_one("PINSHIM_REGISTER_COST", "0") == 0 && shim_cfg.reg_cost_resident == 0);
    CHECK(load_one("PINSHIM_TRUST_ASYNC", "yes") == 0 && shim_cfg.trust_async);
    CHECK(load_one("PINSHIM_NVTX", "off") == 0 && !shim_cfg.nvtx);
    CHECK(load_one("PINSHIM_LOG", "2") == 0 && shim_cfg.log_level == 2);
    CHECK(load_one("PINSHIM_REPORT", "1") == 0 && !strcmp(shim_cfg.report, "1"));
    CHECK(load_one("PINSHIM_STATS", "/tmp/s-%p.json") == 0 && !strcmp(shim_cfg.stats, "/tmp/s-%p.json"));
    /* unset: empty or blank means the default, silently */
    CHECK(load_one("PINSHIM_MIN_SIZE", "") == 0 && shim_cfg.min_size == 64 * KB);
    CHECK(load_one("PINSHIM_MIN_SIZE", "  \t ") == 0 && shim_cfg.min_size == 64 * KB);
    CHECK(load_one("PINSHIM_MODE", "") == 0 && shim_cfg.mode == MODE_FULL);
}

/* A bad value: exactly one line, naming the variable, the text and the default. */
static void expect_one_warning(const char *name, const char *value, const char *shown_default)
{
    int lines = load_one(name, value);
    char quoted[64], named_default[64];
    snprintf(quoted, sizeof quoted, "\"%.40s", value);   /* the text, as far as it is shown */
    snprintf(named_default, sizeof named_default, "the default %s", shown_default);
    char printable[24];
    snprintf(printable, sizeof printable, "%s", value);
    for (char *c = printable; *c; c++)
        if (*c == '\n')
            *c = '?';
    CHECKF(lines == 1 && strstr(captured, name) && strstr(captured, named_default) &&
               (strlen(value) > 40 || strchr(value, '\n') || strstr(captured, quoted)) &&
               !strncmp(captured, "pinshim[", 8),
           "%s=\"%s\" warns exactly once, naming it and the default %s", name, printable,
           shown_default);
}

static void test_bad_values(void)
{
    char pidtag[32];
    snprintf(pidtag, sizeof pidtag, "pinshim[%d]: ", (int)getpid());

    expect_one_warning("PINSHIM_MIN_SIZE", "12Q", "64K");
    CHECK(shim_cfg.min_size == 64 * KB);
    CHECK(!strncmp(captured, pidtag, strlen(pidtag)));
    expect_one_warning("PINSHIM_MIN_SIZE", "99999999999999999999", "64K");
    expect_one_warning("PINSHIM_MIN_SIZE", "17179869184T", "64K");
    expect_one_warning("PINSHIM_MIN_SIZE", "-64K", "64K");
    expect_one_warning("PINSHIM_MIN_SIZE", "64KB", "64K");
    expect_one_warning("PINSHIM_MIN_SIZE", "64 K", "64K");
    expect_one_warning("PINSHIM_MIN_SIZE", "1K", "64K");          /* below the range */
    expect_one_warning("PINSHIM_MIN_SIZE", "2T", "64K");          /* above it */
    CHECK(shim_cfg.min_size == 64 * KB);
    expect_one_warning("PINSHIM_BUDGET", "101%", "25%");
    expect_one_warning("PINSHIM_BUDGET", "lots", "25%");
    CHECK(shim_cfg.budget == config_physical_memory() / 100 * 25 + config_physical_memory() % 100 * 25 / 100);
    expect_one_warning("PINSHIM_NODE_BUDGET", "-1", "0");
    expect_one_warning("PINSHIM_STAGING_CHUNK", "32K", "16M");
    expect_one_warning("PINSHIM_STAGING_BUFFERS", "1", "3");
    expect_one_warning("PINSHIM_STAGING_BUFFERS", "9", "3");
    CHECK(load_one("PINSHIM_COPY_THREADS", "0") == 0 && shim_cfg.copy_threads == 0);
    expect_one_warning("PINSHIM_COPY_THREADS", "65", "0");
    expect_one_warning("PINSHIM_COPY_THREADS", "8K", "0");
    CHECK(shim_cfg.copy_threads == 0);
    expect_one_warning("PINSHIM_BW_PINNED", "0", "54000");
    expect_one_warning("PINSHIM_BW_PINNED", "1000001", "54000");
    expect_one_warning("PINSHIM_REGISTER_FAULT_COST", "100000001", "360000");
    expect_one_warning("PINSHIM_LOG", "3", "0");
    expect_one_warning("PINSHIM_TRUST_ASYNC", "maybe", "0");
    CHECK(!shim_cfg.trust_async);
    expect_one_warning("PINSHIM_MODE", "fast", "full");
    CHECK(shim_cfg.mode == MODE_FULL);

    /* Hostile text still makes one line: newlines shown escaped, long text cut. */
    expect_one_warning("PINSHIM_REWRITE_MIN", "4K\nPINSHIM_FAKE=1", "256K");
    CHECK(strstr(captured, "\\x0a") != NULL);
    static char long_value[3000];
    memset(long_value, '7', sizeof long_value - 1);
    expect_one_warning("PINSHIM_REWRITE_MIN", long_value, "256K");
    CHECK(strlen(captured) < 400);
    static char long_path[700];
    memset(long_path, 'a', sizeof long_path - 1);
    long_path[0] = '/';
    expect_one_warning("PINSHIM_STATS", long_path, "(unset)");
    CHECK(shim_cfg.stats[0] == '\0');

    /* Several bad settings: one line each. */
    env_clear();
    env_set("PINSHIM_MIN_SIZE", "x");
    env_set("PINSHIM_LOG", "9");
    env_set("PINSHIM_NVTX", "2");
    env_set("PINSHIM_COPY_THREADS", "4");
    capture_start();
    config_load(fake_getenv);
    int lines = capture_stop();
    CHECK(lines == 3 && strstr(captured, "PINSHIM_MIN_SIZE") && strstr(captured, "PINSHIM_LOG") &&
          strstr(captured, "PINSHIM_NVTX") && !strstr(captured, "PINSHIM_COPY_THREADS"));
    CHECK(shim_cfg.copy_threads == 4 && shim_cfg.nvtx && shim_cfg.log_level == 0);
}

/* Load from an environment given as "NAME=VALUE" entries, through both doors config_load_env
 * has (getenv for the settings, the entry list for other names); returns the lines logged. */
static int load_entries(char **entries)
{
    static char names[ENV_MAX][128];
    env_clear();
    for (int i = 0; entries[i]; i++) {
        const char *eq = strchr(entries[i], '=');
        snprintf(names[i], sizeof names[i], "%.*s", (int)(eq - entries[i]), entries[i]);
        env_set(names[i], eq + 1);
    }
    capture_start();
    config_load_env(fake_getenv, entries);
    return capture_stop();
}

static void test_unknown_names(void)
{
    char *slip[] = { "PINSHIM_BUGDET=1G", NULL };
    CHECKF(load_entries(slip) == 1 && strstr(captured, "PINSHIM_BUGDET") &&
               strstr(captured, "did you mean PINSHIM_BUDGET?") && !strncmp(captured, "pinshim[", 8),
           "PINSHIM_BUGDET warns once, naming PINSHIM_BUDGET");
    CHECK(shim_cfg.budget == config_physical_memory() / 100 * 25 + config_physical_memory() % 100 * 25 / 100);

    static const struct { const char *entry, *meant; } slips[] = {
        { "PINSHIM_STAT=x.json", "PINSHIM_STATS" }, { "PINSHIM_MINSIZE=1M", "PINSHIM_MIN_SIZE" },
        { "PINSHIM_STAGING_BUFFER=4", "PINSHIM_STAGING_BUFFERS" }, { "pinshim_mode=pin", "PINSHIM_MODE" },
        { "PINSHIM_COPY_THRAEDS=2", "PINSHIM_COPY_THREADS" }, { "PINSHIM_REPORTS=1", "PINSHIM_REPORT" },
    };
    for (size_t i = 0; i < sizeof slips / sizeof slips[0]; i++) {
        char *one[] = { (char *)slips[i].entry, NULL };
        char meant[64];
        snprintf(meant, sizeof meant, "did you mean %s?", slips[i].meant);
        CHECKF(load_entries(one) == 1 && strstr(captured, meant), "%s: one line naming %s",
               slips[i].entry, slips[i].meant);
    }
    /* Names far from every setting are other tools' (the wrapper's PINSHIM_LIB, test knobs). */
    char *far[] = { "PINSHIM_LIB=/x/libpinshim.so", "PINSHIM_GPU_JOBS=4", "PINSHIM_GPU_TIMEOUT=60",
                    "PINSHIM_=1", "PINSHIM", "NOT_PINSHIM_BUDGET=1", "PINSHIM_LOG=1", NULL };
    CHECKF(load_entries(far) == 0 && shim_cfg.log_level == 1, "far names and settings: no line");
    static char long_entry[300];
    memset(long_entry, 'B', sizeof long_entry - 1);
    memcpy(long_entry, "PINSHIM_", 8);
    long_entry[150] = '=';
    char *long_name[] = { long_entry, NULL };
    CHECK(load_entries(long_name) == 0);

    /* config_check: what the wrapper refuses; any name that is not a setting, near or far. */
    char why[512];
    CHECK(config_check("PINSHIM_BUDGET", "8G", why, sizeof why) == 0 && !why[0]);
    CHECK(config_check("PINSHIM_BUDGET", " 50% ", why, sizeof why) == 0);
    CHECK(config_check("PINSHIM_BUDGET", "", why, sizeof why) == 0);
    CHECK(config_check("PINSHIM_BUDGET", "banana", why, sizeof why) == -1 &&
          strstr(why, "PINSHIM_BUDGET=\"banana\" is not valid (expected ") && !strstr(why, "default"));
    CHECK(config_check("PINSHIM_LOG", "3", why, sizeof why) == -1 && strstr(why, "0..2"));
    CHECK(config_check("PINSHIM_MODE", "fast", why, sizeof why) == -1 && strstr(why, "observe"));
    CHECK(config_check("PINSHIM_BUGDET", "1G", why, sizeof why) == -2 &&
          strstr(why, "did you mean PINSHIM_BUDGET?"));
    CHECK(config_check("PINSHIM_FOO", "1", why, sizeof why) == -2 && strstr(why, "PINSHIM_FOO") &&
          !strstr(why, "did you mean"));
    uint64_t before = shim_cfg.min_size;
    CHECK(config_check("PINSHIM_MIN_SIZE", "1M", why, sizeof why) == 0 && shim_cfg.min_size == before);
}

static void test_reported_once(void)
{
    /* The wrapper reported on this environment and says so with its checksum: silence. */
    char *bad[] = { "PINSHIM_BUDGET=banana", "PINSHIM_BUGDET=1G", "PINSHIM_MODE=pin", NULL };
    CHECK(load_entries(bad) == 2);
    uint64_t sum = config_env_checksum(fake_getenv, bad);
    CHECK(sum != 0);

    char checked[64];
    snprintf(checked, sizeof checked, "PINSHIM_CHECKED=%llu", (unsigned long long)sum);
    char *quiet[] = { "PINSHIM_MODE=pin", "PINSHIM_BUGDET=1G", checked, "PINSHIM_BUDGET=banana", NULL };
    CHECKF(load_entries(quiet) == 0, "a matching PINSHIM_CHECKED silences what was reported");
    CHECK(shim_cfg.mode == MODE_PIN && shim_cfg.checked == sum);
    CHECK(shim_cfg.budget == config_physical_memory() / 100 * 25 + config_physical_memory() % 100 * 25 / 100);
    CHECK(config_env_checksum(fake_getenv, quiet) == sum);   /* order and the mark itself do not count */
    char *unset_value[] = { "PINSHIM_BUDGET=banana", "PINSHIM_BUGDET=1G", "PINSHIM_MODE=", NULL };
    load_entries(unset_value);
    CHECK(config_env_checksum(fake_getenv, unset_value) != sum);   /* set to "" is not unset */

    /* Anything changed since: the library speaks again, about everything. */
    char *changed[] = { "PINSHIM_MODE=observe", "PINSHIM_BUGDET=1G", checked, "PINSHIM_BUDGET=banana", NULL };
    CHECKF(load_entries(changed) == 2, "a changed environment warns again");
    char *added[] = { "PINSHIM_MODE=pin", "PINSHIM_BUGDET=1G", checked, "PINSHIM_BUDGET=banana",
                      "PINSHIM_STAT=x", NULL };
    CHECK(load_entries(added) == 3);
    char wrong[64];
    snprintf(wrong, sizeof wrong, "PINSHIM_CHECKED=%llu", (unsigned long long)(sum + 1));
    char *mismatch[] = { "PINSHIM_BUDGET=banana", "PINSHIM_BUGDET=1G", "PINSHIM_MODE=pin", wrong, NULL };
    CHECK(load_entries(mismatch) == 2);
    char *garbage[] = { "PINSHIM_CHECKED=banana", NULL };
    CHECK(load_entries(garbage) == 1 && strstr(captured, "PINSHIM_CHECKED"));
    char *zero[] = { "PINSHIM_CHECKED=0", NULL };
    CHECK(load_entries(zero) == 0 && config_env_checksum(fake_getenv, zero) == 0);
}

static void test_expand_path(void)
{
    static const char *const rank_vars[] = { "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID" };
    for (size_t i = 0; i < 4; i++)
        unsetenv(rank_vars[i]);
    char out[256], want[256];

    snprintf(want, sizeof want, "/tmp/run-%d.json", (int)getpid());
    CHECK(config_expand_path_checked("/tmp/run-%p.json", out, sizeof out));
    CHECK(!strcmp(out, want));
    CHECK(config_expand_path_checked("a%rb", out, sizeof out));
    CHECK(!strcmp(out, "axb"));
    setenv("SLURM_PROCID", "7", 1);
    CHECK(config_expand_path_checked("a%rb", out, sizeof out));
    CHECK(!strcmp(out, "a7b"));
    setenv("PMI_RANK", "5", 1);
    CHECK(config_expand_path_checked("a%rb", out, sizeof out));
    CHECK(!strcmp(out, "a5b"));
    setenv("OMPI_COMM_WORLD_RANK", "4", 1);
    CHECK(config_expand_path_checked("a%rb", out, sizeof out));
    CHECK(!strcmp(out, "a4b"));
    setenv("RANK", "3", 1);
    CHECK(config_expand_path_checked("r%r-p%p", out, sizeof out));
    snprintf(want, sizeof want, "r3-p%d", (int)getpid());
    CHECK(!strcmp(out, want));
    setenv("RANK", "", 1);   /* empty counts as unset */
    CHECK(config_expand_path_checked("%r", out, sizeof out));
    CHECK(!strcmp(out, "4"));
    setenv("RANK", "../1", 1);   /* a rank cannot move the file elsewhere */
    CHECK(config_expand_path_checked("%r", out, sizeof out));
    CHECK(!strchr(out, '/'));
    for (size_t i = 0; i < 4; i++)
        unsetenv(rank_vars[i]);

    CHECK(config_expand_path_checked("100%% %q %", out, sizeof out));
    CHECK(!strcmp(out, "100% %q %"));
    CHECK(config_expand_path_checked("", out, sizeof out));
    CHECK(out[0] == '\0');
    char small[8];
    CHECK(config_expand_path_checked("1234567", small, sizeof small) && !strcmp(small, "1234567"));
    CHECK(!config_expand_path_checked("12345678", small, sizeof small) && small[0] == '\0');
    CHECK(!config_expand_path_checked("abc-%p-%p", small, sizeof small) && small[0] == '\0');
}

static void test_print_table(void)
{
    capture_start();
    config_print_table(log_pipe[1]);
    int lines = capture_stop();
    /* The table's own length, counted from settings.def. */
    int settings = 0;
#define SETTING(name, kind, field, def, lo, hi, unit, desc) settings++;
#include "base/settings.def"
#undef SETTING
    CHECKF(settings >= 22 && lines == settings, "print_table: one line per setting (%d of %d)", lines, settings);
    int good = 0;
    for (char *line = captured; *line;) {
        char *end = strchr(line, '\n');
        int bars = 0;
        for (char *c = line; c < end; c++)
            bars += *c == '|';
        good += bars == 4 && !strncmp(line, "PINSHIM_", 8);
        line = end + 1;
    }
    CHECK(good == lines);
    CHECK(strstr(captured, "PINSHIM_MIN_SIZE|64K|4K..1T|bytes|") != NULL);
    CHECK(strstr(captured, "PINSHIM_BUDGET|25%|0..1024T or 0%..100%|") != NULL);
    CHECK(strstr(captured, "PINSHIM_COPY_THREADS|0|0..64|threads|") != NULL);
    CHECK(strstr(captured, "PINSHIM_REPORT|\"\"|") != NULL);
}

static void test_log(void)
{
    env_clear();
    config_load(fake_getenv);
    char pidtag[32];
    snprintf(pidtag, sizeof pidtag, "pinshim[%d]: ", (int)getpid());

    capture_start();
    shim_log(LOG_INFO, "hidden %d", 1);
    shim_log(LOG_DEBUG, "hidden %d", 2);
    shim_log(LOG_WARN, "shown %s", "always");
    CHECK(capture_stop() == 1 && !strncmp(captured, pidtag, strlen(pidtag)) &&
          strstr(captured, "shown always\n"));

    shim_cfg.log_level = 1;
    capture_start();
    shim_log(LOG_INFO, "info");
    shim_log(LOG_DEBUG, "debug");
    CHECK(capture_stop() == 1 && strstr(captured, "info"));
    shim_cfg.log_level = 2;
    capture_start();
    shim_log(LOG_DEBUG, "two\nlines");
    CHECK(capture_stop() == 1 && strstr(captured, "two lines"));

    static char big[4000];
    memset(big, 'z', sizeof big - 1);
    capture_start();
    shim_log(LOG_WARN, "%s", big);
    CHECK(capture_stop() == 1 && strlen(captured) <= 1024 && strstr(captured, "...\n"));
    shim_cfg.log_level = 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--print-table")) {
        config_print_table(1);
        return 0;
    }
    test_parse_size();
    test_parse_percent();
    test_parse_uint_bool();
    test_defaults();
    test_valid_values();
    test_bad_values();
    test_unknown_names();
    test_reported_once();
    test_expand_path();
    test_print_table();
    test_log();
    return TEST_SUMMARY();
}
