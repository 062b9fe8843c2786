/* pinshim-settings: pinshim's settings checked by the library's own parser (shim/base/config.c,
 * linked in), so that the wrapper scripts never keep a second copy of the rules. */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PINSHIM_VERSION_STRING
#define PINSHIM_VERSION_STRING "unknown"
#endif
#ifndef PINSHIM_COMMIT_STRING
#define PINSHIM_COMMIT_STRING "unknown"
#endif

static const char usage_text[] =
    "usage: pinshim-settings [NAME=VALUE ...]\n"
    "       pinshim-settings --table\n"
    "       pinshim-settings [--loaded LIB] --checksum\n"
    "       pinshim-settings --version | --help\n"
    "\n"
    "Checks pinshim settings with the library's own parser.\n"
    "\n"
    "  NAME=VALUE ...  check these settings: one line on stderr for each value the library\n"
    "                  would refuse and each NAME that is not a setting\n"
    "  (no argument)   check the PINSHIM_* variables of the environment as the library reads\n"
    "                  them at start-up, with the library's own warnings\n"
    "  --table         every setting: name|default|range|unit|description\n"
    "  --checksum      print the checksum of the environment's PINSHIM_* variables (the value\n"
    "                  of PINSHIM_CHECKED that keeps the library from repeating its warnings)\n"
    "  --loaded LIB    fail (exit status 3) unless LIB is loaded into this process, i.e.\n"
    "                  LD_PRELOAD really brings it in\n"
    "\n"
    "Exit status: 0 all good; 1 some setting is wrong; 2 usage error; 3 LIB is not loaded.\n";

static int check_pairs(int argc, char **argv)
{
    int bad = 0;
    for (int i = 0; i < argc; i++) {
        char name[256], why[512];
        const char *eq = strchr(argv[i], '=');
        size_t len = eq ? (size_t)(eq - argv[i]) : 0;
        if (!eq || !len || len >= sizeof name) {
            fprintf(stderr, "pinshim-settings: %s: expected NAME=VALUE\n", argv[i]);
            return 2;
        }
        memcpy(name, argv[i], len);
        name[len] = '\0';
        if (config_check(name, eq + 1, why, sizeof why) != 0) {
            fprintf(stderr, "%s\n", why);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    extern char **environ;
    const char *must_be_loaded = NULL;
    int want_checksum = 0;
    int i = 1;

    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("pinshim-settings %s (commit %s)\n", PINSHIM_VERSION_STRING, PINSHIM_COMMIT_STRING);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--table")) {
        fflush(stdout);
        config_print_table(1);
        return 0;
    }
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--checksum")) {
            want_checksum = 1;
        } else if (!strcmp(argv[i], "--loaded") && i + 1 < argc) {
            must_be_loaded = argv[++i];
        } else {
            fprintf(stderr, "pinshim-settings: unknown option or missing value: %s\n%s",
                    argv[i], usage_text);
            return 2;
        }
    }
    if (want_checksum || must_be_loaded) {
        if (i < argc) {
            fprintf(stderr, "pinshim-settings: --checksum and --loaded take no NAME=VALUE\n");
            return 2;
        }
        if (must_be_loaded && !dlopen(must_be_loaded, RTLD_LAZY | RTLD_NOLOAD))
            return 3;
        if (want_checksum)
            printf("%llu\n", (unsigned long long)config_env_checksum(NULL, environ));
        return 0;
    }
    if (i < argc)
        return check_pairs(argc - i, argv + i);
    return config_load_env(NULL, environ) ? 1 : 0;
}
